"""Seats of WebSocket event clients: at most so many in all, and so many on one stream.

Every connected client costs a subscription, a queue and the event loop's time for each
result it is sent; without a cap a thousand idle clients on one stream slowed /healthz to a
p99 of 217 ms. `Seats.take` answers either a seat or why not (`limits.max_websocket_clients`,
`limits.max_websocket_clients_per_stream`; the all-streams feed /v1/events counts as a
stream of its own). Used on the event loop only.
"""

from __future__ import annotations

import collections

ALL_STREAMS = ""  # the key of /v1/events


class Seats:
    def __init__(self, total: int, per_stream: int) -> None:
        self.total = total
        self.per_stream = per_stream
        self.taken: collections.Counter[str] = collections.Counter()

    def take(self, stream_id: str | None) -> str | None:
        """A seat on `stream_id` (None: all streams), or why there is none (nothing taken)."""
        key = ALL_STREAMS if stream_id is None else stream_id
        if self.taken.total() >= self.total:
            return (
                f"{self.total} WebSocket clients are connected, the most this server takes "
                "(limits.max_websocket_clients); retry later"
            )
        if self.taken[key] >= self.per_stream:
            where = "all streams" if stream_id is None else f"stream {stream_id!r}"
            return (
                f"{self.per_stream} WebSocket clients follow {where}, the most one feed "
                "takes (limits.max_websocket_clients_per_stream); retry later"
            )
        self.taken[key] += 1
        return None

    def give_back(self, stream_id: str | None) -> None:
        key = ALL_STREAMS if stream_id is None else stream_id
        self.taken[key] -= 1
        if self.taken[key] <= 0:
            del self.taken[key]
