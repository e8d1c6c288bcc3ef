"""A fleet node's results, both ways between its results hub and the fleet's results bus.

Out: the hub hands what this node's streams publish to `ResultsFeed.outlet` (on the publishing
threads) instead of numbering it (`ResultsHub.send_to`); the outlet encodes it once (a result
made in this process; a worker process's arrives encoded), queues it, bounded, and one task on
the event loop publishes the queue without waiting for each acknowledgement. A result whose
stream this node no longer holds is not published (vdet.fleet.results_bus).

In: one reader follows the whole bus and gives every result, this node's among them, to the
hub with the bus's sequence as its seq (`ResultsHub.publish_numbered`): every node's hub holds
the fleet's results under the same numbers, so a WebSocket client resumes on any node. At
start the reader first replays the newest results the hub can hold, so a node that restarts
serves resumes at once.

What comes off the bus is another node's message: its subject must name a valid stream id and
its payload must be a frame index and a result text of the expected shape, or it is dropped
and counted (`ignored`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.client import JetStreamContext

from vdet.core.types import DetectionResult
from vdet.fleet.keys import key_problem
from vdet.fleet.results_bus import BusGap, ResultsPublisher, ResultsReader, stream_name
from vdet.results.hub import ResultsHub

log = logging.getLogger(__name__)

_MAX_PAYLOAD = 4 << 20  # a result's text is kilobytes; a larger payload is not one of ours


def payload_of(frame_index: int, tail: str) -> bytes:
    """What goes on the bus for one result: its frame index, a space, its wire text after the
    seq (vdet.results.wire.encode_result_tail)."""
    return f"{frame_index} {tail}".encode()


def parse_payload(payload: bytes) -> tuple[int, str] | None:
    """(frame index, wire text after the seq), or None for a payload that is not a result."""
    if len(payload) > _MAX_PAYLOAD:
        return None
    try:
        text = payload.decode()
    except UnicodeDecodeError:
        return None
    head, _, tail = text.partition(" ")
    if not head.isdigit() or len(head) > 18:
        return None
    # The text after the seq of a result event: more fields of the result, then its end.
    if not tail.startswith(',"') or not tail.endswith("}}") or "\n" in tail:
        return None
    return int(head), tail


class ResultsFeed:
    """Carries one node's results out to the bus and the fleet's back into its hub (module
    docstring). `encode(result)`: a result made in this process as its wire text after the seq.
    Counters: `dropped` (the outgoing queue was full: NATS slower than the streams),
    `ignored` (messages off the bus that were not results), `gaps` (results the servers no
    longer kept when the reader asked for them); `lag`: results on the bus after the last one
    read (how far this node's feed is behind the fleet). `on_ack(seconds)`: each published
    result's time from the outlet to the servers' acknowledgement."""

    def __init__(
        self,
        js: JetStreamContext,
        prefix: str,
        hub: ResultsHub,
        holds: Callable[[str], bool],
        encode: Callable[[DetectionResult], str],
        loop: asyncio.AbstractEventLoop,
        *,
        max_outgoing: int = 16384,
        on_ack: Callable[[float], object] | None = None,
    ) -> None:
        self._js = js
        self._prefix = prefix
        self._hub = hub
        self._encode = encode
        self._loop = loop
        self.publisher = ResultsPublisher(js, prefix, holds, on_ack)
        self._max_outgoing = max_outgoing
        self._outgoing: deque[tuple[str, bytes, float]] = deque()
        self._lock = threading.Lock()
        self._woken = False
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.dropped = 0
        self.ignored = 0
        self.gaps = 0
        self.read = 0  # results read off the bus (every node's)
        self.read_through = 0  # the last bus sequence handed to the hub
        self.lag = 0

    # -- out -----------------------------------------------------------------------------

    def outlet(self, source_id: str, frame_index: int, result: str | DetectionResult) -> None:
        """The hub's outlet (`ResultsHub.send_to`); called on publishing threads."""
        tail = result if isinstance(result, str) else self._encode(result)
        item = (source_id, payload_of(frame_index, tail), time.monotonic())
        with self._lock:
            if len(self._outgoing) >= self._max_outgoing:
                self.dropped += 1
                return
            self._outgoing.append(item)
            wake, self._woken = not self._woken, True
        if wake:
            self._loop.call_soon_threadsafe(self._wake.set)

    async def _send(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            with self._lock:
                batch = list(self._outgoing)
                self._outgoing.clear()
                self._woken = False
            for stream_id, payload, queued_at in batch:
                try:
                    await self.publisher.publish_nowait(stream_id, payload, queued_at)
                except Exception as exc:  # disconnected past the client's buffer, say
                    self.publisher.failed += 1
                    log.warning("fleet: publishing a result of %s failed: %s", stream_id, exc)

    # -- in ------------------------------------------------------------------------------

    async def _read(self, after: int) -> None:
        while True:
            try:
                reader = await ResultsReader.open(self._js, self._prefix, after)
            except Exception as exc:  # NATS not answering: try again
                log.warning("fleet: reading the results bus failed: %s", exc)
                await asyncio.sleep(0.5)
                continue
            try:
                while True:
                    try:
                        item = await reader.next(timeout=1.0)
                    except NatsTimeoutError:
                        continue
                    if isinstance(item, BusGap):
                        self.gaps += item.missing
                        continue
                    after = item.seq
                    self.read_through = item.seq
                    self.lag = item.pending
                    self.read += 1
                    parsed = parse_payload(item.payload)
                    if parsed is None or key_problem(item.stream_id) is not None:
                        self.ignored += 1
                        continue
                    self._hub.publish_numbered(item.seq, item.stream_id, parsed[0], parsed[1])
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the consumer was lost (a server gone): from `after`
                log.warning("fleet: the results reader stopped (%s); reading again", exc)
                await asyncio.sleep(0.2)
            finally:
                await reader.close()

    def totals(self) -> dict[str, int]:
        """Running totals by outcome (vdet_fleet_results_total)."""
        publisher = self.publisher
        return {
            "published": publisher.published,
            "fenced": publisher.fenced,
            "failed": publisher.failed,
            "dropped": self.dropped,
            "read": self.read,
            "ignored": self.ignored,
            "gap": self.gaps,
        }

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self, replay: int) -> None:
        """Start both directions; the reader begins `replay` results before the bus's end."""
        info = await self._js.stream_info(stream_name(self._prefix))
        last = int(info.state.last_seq or 0)
        self._tasks = [
            asyncio.create_task(self._send(), name="fleet-results-out"),
            asyncio.create_task(self._read(max(0, last - replay)), name="fleet-results-in"),
        ]

    async def stop(self) -> None:
        """Publish what is queued, wait for its acknowledgements (briefly), stop reading."""
        with contextlib.suppress(Exception):
            self._wake.set()
            await asyncio.sleep(0)
            await asyncio.wait_for(self.publisher.flush(), 2.0)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []


__all__ = ["ResultsFeed", "parse_payload", "payload_of"]
