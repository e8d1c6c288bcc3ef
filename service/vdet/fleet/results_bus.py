"""Results on one JetStream stream: each node publishes what its streams detect, any node reads
the whole fleet's results from any sequence.

The stream `<prefix>_results` holds subjects `<prefix>.results.<stream id>`, limits retention
(`max_age_s`, `max_bytes`: the oldest go first) on the servers' disks, with the fleet's
replicas. A result's JetStream sequence is global across the fleet and never reused, which is
what the WebSocket contract's `seq` needs: a client that read up to `seq` N on one node can
resume after N on any other, with no gap and no duplicate, as long as retention still holds
N + 1 (else the reader says how many are gone: a `gap`).

A result is encoded once, on the node that made it (the payload is the wire text), and
published only while that node holds the stream's lease (`holds`, vdet.fleet.node): a node
that lost its lease, or was paused past the point where it could prove it, publishes
nothing more for that stream, so the bus never carries one stream from two nodes at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from typing import Any

from nats.js.api import ConsumerConfig, DeliverPolicy, StorageType, StreamConfig
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError


@dataclasses.dataclass(frozen=True)
class ResultsRetention:
    """How much of the fleet's results the servers keep (the resume window)."""

    max_age_s: float = 3600.0
    max_bytes: int = 1 << 30
    replicas: int = 1


@dataclasses.dataclass(frozen=True)
class BusResult:
    """One result as read from the bus."""

    seq: int
    stream_id: str
    payload: bytes
    pending: int = 0  # results on the bus after this one (the reader's lag behind the bus)


@dataclasses.dataclass(frozen=True)
class BusGap:
    """Results before `first` are no longer on the servers (retention): `missing` of them
    between what the reader asked for and what it will get."""

    missing: int
    first: int


def subject_of(prefix: str, stream_id: str) -> str:
    return f"{prefix}.results.{stream_id}"


def stream_name(prefix: str) -> str:
    return f"{prefix}_results"


async def open_results(js: JetStreamContext, prefix: str, retention: ResultsRetention) -> str:
    """The results stream (made when it does not exist yet); its name."""
    name = stream_name(prefix)
    try:
        await js.stream_info(name)
    except NotFoundError:
        await js.add_stream(
            StreamConfig(
                name=name,
                subjects=[f"{prefix}.results.>"],
                max_age=retention.max_age_s,
                max_bytes=retention.max_bytes,
                storage=StorageType.FILE,
                num_replicas=retention.replicas,
            )
        )
    return name


class ResultsPublisher:
    """Publishes one node's results; `holds(stream_id)` says whether the node may (its
    lease). `fenced` counts results refused for want of a lease, `failed` those the servers
    did not acknowledge. `on_ack(seconds)`: called with the time from a result's queueing to
    the servers' acknowledgement of it (`publish_nowait`), on the event loop."""

    def __init__(
        self,
        js: JetStreamContext,
        prefix: str,
        holds: Callable[[str], bool],
        on_ack: Callable[[float], object] | None = None,
    ) -> None:
        self._js = js
        self._prefix = prefix
        self._stream = stream_name(prefix)
        self._holds = holds
        self._on_ack = on_ack
        self.fenced = 0
        self.failed = 0
        self.published = 0

    async def publish(self, stream_id: str, payload: bytes) -> int | None:
        """Publish and wait for the servers' acknowledgement: the result's fleet-wide
        sequence, or None when this node may not publish for `stream_id` (the result is
        dropped here: another node runs the stream)."""
        if not self._holds(stream_id):
            self.fenced += 1
            return None
        ack = await self._js.publish(
            subject_of(self._prefix, stream_id), payload, stream=self._stream
        )
        self.published += 1
        return int(ack.seq)

    async def publish_nowait(
        self, stream_id: str, payload: bytes, queued_at: float | None = None
    ) -> bool:
        """Publish without waiting for the acknowledgement (a stream's results go out in
        order; their sequences come back through a `ResultsReader`): about a sixth of the CPU
        of `publish` (bench/fleet_bus.py). False when fenced. A result the servers do not
        acknowledge is counted in `failed`; `flush` waits for every acknowledgement.
        `queued_at`: when the result was queued (time.monotonic), for `on_ack`."""
        if not self._holds(stream_id):
            self.fenced += 1
            return False
        future = await self._js.publish_async(
            subject_of(self._prefix, stream_id), payload, stream=self._stream
        )
        started = time.monotonic() if queued_at is None else queued_at
        future.add_done_callback(lambda done: self._acknowledged(done, started))
        self.published += 1
        return True

    async def flush(self) -> None:
        await self._js.publish_async_completed()

    def _acknowledged(self, future: Any, started: float) -> None:
        if future.cancelled() or future.exception() is not None:
            self.failed += 1
        elif self._on_ack is not None:
            self._on_ack(time.monotonic() - started)


class ResultsReader:
    """Every result after sequence `after` (of one stream, or of all), in sequence order, then
    each new one as it is published; a `BusGap` first when retention dropped some of them.
    Bounded: at most `pending_bytes` of results wait in this process for a slow reader (the
    ordered consumer's flow control keeps the rest on the servers); the count is not what
    bounds it (a replay of a long backlog would overflow a count first and make the client
    drop and re-ask for messages)."""

    def __init__(self, subscription: Any, prefix: str, gap: BusGap | None) -> None:
        self._subscription = subscription
        self._skip = len(f"{prefix}.results.")
        self._gap = gap

    @classmethod
    async def open(
        cls,
        js: JetStreamContext,
        prefix: str,
        after: int,
        stream_id: str | None = None,
        pending_bytes: int = 32 << 20,
    ) -> ResultsReader:
        name = stream_name(prefix)
        info = await js.stream_info(name)
        start = after + 1
        first, last = int(info.state.first_seq or 0), int(info.state.last_seq or 0)
        gap = None
        if int(info.state.messages or 0) and first > start:
            gap = BusGap(missing=first - start, first=first)
        elif not int(info.state.messages or 0) and last >= start:  # everything aged out
            gap = BusGap(missing=last - start + 1, first=last + 1)
        subject = subject_of(prefix, stream_id) if stream_id else f"{prefix}.results.>"
        subscription = await js.subscribe(
            subject,
            stream=name,
            ordered_consumer=True,
            pending_msgs_limit=1 << 20,
            pending_bytes_limit=pending_bytes,
            config=ConsumerConfig(
                deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=max(1, start)
            ),
        )
        return cls(subscription, prefix, gap)

    async def next(self, timeout: float = 5.0) -> BusResult | BusGap:
        """The next item; TimeoutError (nats') when none comes within `timeout`."""
        if self._gap is not None:
            gap, self._gap = self._gap, None
            return gap
        msg = await self._subscription.next_msg(timeout=timeout)
        metadata = msg.metadata
        seq = int(metadata.sequence.stream)
        pending = int(metadata.num_pending or 0)
        return BusResult(seq, msg.subject[self._skip :], bytes(msg.data), pending)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._subscription.unsubscribe()


__all__ = [
    "BusGap",
    "BusResult",
    "ResultsPublisher",
    "ResultsReader",
    "ResultsRetention",
    "open_results",
    "stream_name",
    "subject_of",
]
