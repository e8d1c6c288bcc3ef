"""The results hub: where processed frames are numbered, kept for replay and fanned out.

It owns the global sequence number (`DetectionResult.seq`, strictly increasing across all
sources), the latest result per source, a bounded replay history, and one bounded queue per
live subscriber. Pipeline threads call `publish`; the event loop reads from subscriptions.

It must not block the publisher on a slow reader: a subscriber whose queue is full is cut off
and marked lagging, and the client resumes from the replay history with the last seq it saw.
It knows nothing about HTTP, JSON or metrics.

What it keeps for replay is compact: a result that arrives already encoded (`encoded_tail`,
from a worker process) is kept as a plain tuple of int and str, which CPython's garbage
collector stops tracking, instead of its object graph (result, detections, timings). Thousands
of kept results then cost a full collection nothing to walk, and such a collection is a pause
of every thread of the API process. Only the latest result per source is kept whole (REST
serves its detections). Replays and subscriptions hand such results out as `EncodedResult`s.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable

from vdet.core.types import DetectionResult

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class EncodedResult:
    """A kept result that arrived encoded: what replay and live delivery need of it, without
    its detections. `encoded_tail` is as in `DetectionResult` (the wire text after the seq)."""

    seq: int
    source_id: str
    frame_index: int
    encoded_tail: str


# What replays and subscriptions hand out: the result as published (no `encoded_tail`: a result
# made in this process) or its compact form.
HubResult = DetectionResult | EncodedResult

# Where a fleet node's hub sends what this process publishes (`ResultsHub.send_to`): the
# source, the frame index, and the result's wire text after its seq, or the whole result when
# it was made in this process and not encoded yet.
Outlet = Callable[[str, int, "str | DetectionResult"], object]

# One kept result: (seq, source_id, frame_index, encoded tail or the whole result). A tuple of
# int and str only is untracked by the garbage collector after its first young collection.
_Kept = tuple[int, str, int, str | DetectionResult]


@dataclasses.dataclass(frozen=True, slots=True)
class _EncodedLatest:
    """A source's newest result as `publish_encoded` got it: its number and wire text."""

    seq: int
    frame_index: int
    tail: str


def _handed_out(kept: _Kept) -> HubResult:
    seq, source_id, frame_index, payload = kept
    if isinstance(payload, str):
        return EncodedResult(seq, source_id, frame_index, payload)
    return payload


class SubscriptionEnd(enum.StrEnum):
    """Why a subscription stopped delivering results."""

    CLOSED = "closed"  # the subscriber or the hub closed it
    LAGGING = "lagging"  # the subscriber fell `queue_size` results behind
    SOURCE_REMOVED = "source_removed"  # its source was removed from the hub


class SubscriptionEndedError(Exception):
    """Raised by `Subscription.get` once the subscription has ended; `reason` says why."""

    def __init__(self, reason: SubscriptionEnd) -> None:
        super().__init__(reason.value)
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class Replay:
    """What a new subscriber must send before live results so that nothing is missed twice.

    `results` holds everything still kept with seq > the requested one, oldest first.
    `gap` is True when results after the requested seq have already been evicted (or the
    requested seq is from before a restart, i.e. larger than anything published here);
    `oldest_seq` is then the first seq that can still be replayed (None when nothing is kept).
    """

    results: tuple[HubResult, ...]
    gap: bool
    oldest_seq: int | None


class Subscription:
    """A bounded, single-consumer queue of results for one event-loop reader.

    Created by `ResultsHub.subscribe` on the event loop; filled by its loop's `_Outbox`, so all
    state below is touched by the loop thread only.
    """

    def __init__(
        self,
        hub: ResultsHub,
        source_id: str | None,
        loop: asyncio.AbstractEventLoop,
        queue_size: int,
        replay: Replay,
        start_seq: int,
    ) -> None:
        self.source_id = source_id
        self.replay = replay
        self.start_seq = start_seq  # the hub's last seq when subscribing
        self._hub = hub
        self._loop = loop
        self._queue_size = queue_size
        self._items: deque[HubResult] = deque()
        self._wakeup = asyncio.Event()
        self._end: SubscriptionEnd | None = None
        # Live delivery starts after everything published before subscribing: the replay
        # covered what it was asked for, and a result still on its way to this loop (see
        # `_Outbox`) when the subscription began is not part of it.
        self._last_seq = start_seq

    @property
    def ended(self) -> SubscriptionEnd | None:
        return self._end

    def _deliver(self, result: HubResult) -> None:
        if self._end is not None or result.seq <= self._last_seq:
            return
        if len(self._items) >= self._queue_size:
            self._finish(SubscriptionEnd.LAGGING)
            return
        self._last_seq = result.seq
        self._items.append(result)
        self._wakeup.set()

    def _finish(self, reason: SubscriptionEnd) -> None:
        if self._end is not None:
            return
        self._end = reason
        # A lagging reader resumes from the hub's history, so what it has not read is dropped
        # now rather than held for a client that cannot keep up.
        self._items.clear()
        self._wakeup.set()
        self._hub._unregister(self)

    async def get(self) -> HubResult:
        """The next live result; raises SubscriptionEndedError once the subscription has ended."""
        while True:
            if self._items:
                return self._items.popleft()
            if self._end is not None:
                raise SubscriptionEndedError(self._end)
            self._wakeup.clear()
            await self._wakeup.wait()

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> HubResult:
        try:
            return await self.get()
        except SubscriptionEndedError:
            raise StopAsyncIteration from None

    def close(self) -> None:
        """Stop receiving; safe to call more than once. Call on the loop thread."""
        self._finish(SubscriptionEnd.CLOSED)

    def _end_threadsafe(self, reason: SubscriptionEnd) -> None:
        # A closed loop (RuntimeError) has nobody left to tell.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._finish, reason)


class _Outbox:
    """Results on their way to the subscriptions of one event loop.

    Publishers append under the hub's lock (so in seq order) and wake the loop only when no
    delivery is scheduled: one `call_soon_threadsafe` (a self-pipe write and a loop wake-up)
    per burst of results, not one per result and subscriber, which at thousands of results per
    second and several clients would be most of the loop's work.

    One delivery callback hands out at most `batch` results and schedules the next for the
    rest: a burst that piled up while the loop was busy must not hold every other callback
    (timers, requests, socket writes) back for its whole length.
    """

    batch = 64

    def __init__(self, hub: ResultsHub, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.subscribers: set[Subscription] = set()
        self._hub = hub
        self._pending: deque[_Kept] = deque()
        self._scheduled = False  # a `_deliver` is on its way to the loop (hub lock held)

    def put_locked(self, kept: _Kept) -> None:
        """Queue a kept result (hub lock held)."""
        self._pending.append(kept)
        if not self._scheduled:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody to deliver to
                self.loop.call_soon_threadsafe(self._deliver)
                self._scheduled = True

    def _deliver(self) -> None:
        with self._hub._lock:
            pending = self._pending
            results = [pending.popleft() for _ in range(min(len(pending), self.batch))]
            subscribers = list(self.subscribers)
            more = bool(pending)
            self._scheduled = more
        for kept in results:
            source = kept[1]
            result = _handed_out(kept)  # once, shared by every subscriber
            for sub in subscribers:
                if sub.source_id is None or sub.source_id == source:
                    sub._deliver(result)
        if more:  # the rest after whatever else is ready to run
            self.loop.call_soon(self._deliver)


class ResultsHub:
    """Numbers, keeps and fans out `DetectionResult`s. Thread-safe."""

    def __init__(
        self,
        capacity_per_source: int = 256,
        capacity_total: int = 16384,
        subscriber_queue_size: int = 2048,
    ) -> None:
        for name, value in (
            ("capacity_per_source", capacity_per_source),
            ("capacity_total", capacity_total),
            ("subscriber_queue_size", subscriber_queue_size),
        ):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        self._lock = threading.Lock()
        self._seq = 0
        self._capacity_per_source = capacity_per_source
        self._subscriber_queue_size = subscriber_queue_size
        self._history: deque[_Kept] = deque(maxlen=capacity_total)
        self._per_source: dict[str, deque[_Kept]] = {}
        # Highest seq per source that can no longer be replayed from its own history: a resume
        # from below it must be told about the gap.
        self._evicted_through: dict[str, int] = {}
        # Each source's newest result: whole (`publish`) or its wire text (`publish_encoded`).
        self._latest: dict[str, DetectionResult | _EncodedLatest] = {}
        self._outboxes: dict[asyncio.AbstractEventLoop, _Outbox] = {}
        self._on_publish: Callable[[DetectionResult], object] | None = None
        self._observers: tuple[Callable[[HubResult], object], ...] = ()
        self._outlet: Outlet | None = None

    def on_publish(self, callback: Callable[[DetectionResult], object] | None) -> None:
        """Call `callback(numbered result)` on the publishing thread, after each publish, while
        anyone subscribes: work every subscriber would otherwise repeat on its event loop
        (encoding) is done once, off the loop."""
        self._on_publish = callback

    def add_observer(self, callback: Callable[[HubResult], object]) -> None:
        """Call `callback(numbered result)` on the publishing thread for every result, whether
        anyone subscribes or not: for cheap bookkeeping that must see everything (the event
        history). It must not block; an exception is logged and the result published anyway."""
        self._observers = (*self._observers, callback)

    def _observe(self, result: HubResult) -> None:
        for callback in self._observers:
            try:
                callback(result)
            except Exception:
                log.exception("a results observer failed on result %d", result.seq)

    def send_to(self, outlet: Outlet | None) -> None:
        """Hand what this process publishes to `outlet` instead of numbering it here: in a
        fleet the results bus numbers every node's results and brings them back, this node's
        among them, through `publish_numbered` (vdet.fleet.feed). `remove_source` then only
        forgets what the fleet says is gone (`forget_source`): a stream stopped here may run
        on another node."""
        self._outlet = outlet

    def publish(self, result: DetectionResult) -> DetectionResult:
        """Number `result`, keep it and hand it to subscribers; returns the numbered copy
        (with an outlet: hands it there and returns it unnumbered, seq 0)."""
        if (outlet := self._outlet) is not None:
            outlet(result.source_id, result.frame_index, result.encoded_tail or result)
            return result
        with self._lock:
            self._seq += 1
            numbered = dataclasses.replace(result, seq=self._seq)
            source = numbered.source_id
            tail = numbered.encoded_tail
            kept: _Kept = (
                self._seq,
                source,
                numbered.frame_index,
                numbered if tail is None else tail,
            )
            self._history.append(kept)
            ring = self._per_source.get(source)
            if ring is None:
                ring = self._per_source[source] = deque()
            if len(ring) >= self._capacity_per_source:
                self._evicted_through[source] = ring.popleft()[0]
            ring.append(kept)
            self._latest[source] = numbered
            # Queued under the lock so every loop sees results in seq order.
            for outbox in self._outboxes.values():
                outbox.put_locked(kept)
            ahead = self._on_publish if self._outboxes else None
        if ahead is not None:
            try:
                ahead(numbered)
            except Exception:  # only an optimisation: the result is published regardless
                log.exception("on_publish failed for result %d", numbered.seq)
        if self._observers:
            self._observe(numbered)
        return numbered

    def flush(self) -> None:
        """Nothing to do: `publish` hands each result out at once (the stream manager's
        `ResultSink` protocol has this for sinks that batch)."""

    def publish_encoded(self, source_id: str, frame_index: int, encoded_tail: str) -> int:
        """Number, keep and hand out a result that arrives already encoded (from a stream
        worker process, which keeps the result itself); returns its seq (with an outlet: hands
        it there and returns 0)."""
        if (outlet := self._outlet) is not None:
            outlet(source_id, frame_index, encoded_tail)
            return 0
        with self._lock:
            self._seq += 1
            seq = self._seq
            self._keep_encoded_locked(seq, source_id, frame_index, encoded_tail)
        if self._observers:
            self._observe(EncodedResult(seq, source_id, frame_index, encoded_tail))
        return seq

    def publish_numbered(
        self, seq: int, source_id: str, frame_index: int, encoded_tail: str
    ) -> bool:
        """Keep and hand out an encoded result numbered elsewhere (the fleet's results bus,
        whose sequence is the fleet's seq); False, and nothing done, for a `seq` not above the
        last one (a replay of what is here already)."""
        with self._lock:
            if seq <= self._seq:
                return False
            self._seq = seq
            self._keep_encoded_locked(seq, source_id, frame_index, encoded_tail)
        if self._observers:
            self._observe(EncodedResult(seq, source_id, frame_index, encoded_tail))
        return True

    def _keep_encoded_locked(
        self, seq: int, source_id: str, frame_index: int, encoded_tail: str
    ) -> None:
        kept: _Kept = (seq, source_id, frame_index, encoded_tail)
        self._history.append(kept)
        ring = self._per_source.get(source_id)
        if ring is None:
            ring = self._per_source[source_id] = deque()
        if len(ring) >= self._capacity_per_source:
            self._evicted_through[source_id] = ring.popleft()[0]
        ring.append(kept)
        self._latest[source_id] = _EncodedLatest(seq, frame_index, encoded_tail)
        for outbox in self._outboxes.values():
            outbox.put_locked(kept)

    @property
    def last_seq(self) -> int:
        """The seq of the newest result published so far (0 before the first)."""
        with self._lock:
            return self._seq

    @property
    def oldest_seq(self) -> int | None:
        """The oldest seq still replayable across all sources; None when nothing is kept."""
        with self._lock:
            return self._history[0][0] if self._history else None

    def latest_encoded(self, source_id: str) -> HubResult | None:
        """The source's newest result: its wire text (`EncodedResult`) when the hub has it (the
        result came from a worker process), else the result itself; None before the first.
        What `GET .../detections` serves."""
        with self._lock:
            latest = self._latest.get(source_id)
        if latest is None:
            return None
        if isinstance(latest, _EncodedLatest):
            return EncodedResult(latest.seq, source_id, latest.frame_index, latest.tail)
        if latest.encoded_tail is not None:
            return EncodedResult(latest.seq, source_id, latest.frame_index, latest.encoded_tail)
        return latest

    def latest_seq(self, source_id: str) -> int | None:
        """The seq of the source's newest result (None before its first)."""
        with self._lock:
            latest = self._latest.get(source_id)
        return None if latest is None else latest.seq

    def find(self, source_id: str, frame_index: int, wait_s: float = 0.0) -> HubResult | None:
        """The kept result of one source's frame, waiting up to `wait_s` for it to be published
        (it may be on its way from a worker process); None if it never is."""
        deadline = time.monotonic() + wait_s
        while True:
            with self._lock:
                for kept in reversed(self._per_source.get(source_id, ())):
                    if kept[2] == frame_index:
                        return _handed_out(kept)
                    if kept[2] < frame_index:
                        break
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.005)

    def since(self, after_seq: int, source_id: str | None = None) -> list[HubResult]:
        """Kept results with seq > after_seq, oldest first, of one source or of all."""
        with self._lock:
            return self._since_locked(after_seq, source_id)

    def _since_locked(self, after_seq: int, source_id: str | None) -> list[HubResult]:
        kept: Iterable[_Kept]
        kept = self._history if source_id is None else self._per_source.get(source_id, ())
        return [_handed_out(k) for k in kept if k[0] > after_seq]

    def _replay_locked(self, after_seq: int, source_id: str | None) -> Replay:
        results = self._since_locked(after_seq, source_id)
        if source_id is None:
            oldest = self._history[0][0] if self._history else None
            evicted_through = (oldest - 1) if oldest is not None else self._seq
        else:
            ring = self._per_source.get(source_id)
            oldest = ring[0][0] if ring else None
            evicted_through = self._evicted_through.get(source_id, 0)
        gap = after_seq < evicted_through or after_seq > self._seq
        if after_seq > self._seq:  # a seq from before a restart: replay everything kept
            results = self._since_locked(0, source_id)
        return Replay(tuple(results), gap, oldest)

    def subscribe(
        self,
        source_id: str | None = None,
        after_seq: int | None = None,
        *,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> Subscription:
        """Start receiving results of one source (or all) on `loop` (default: the running one).

        With `after_seq`, `subscription.replay` holds the kept results after it, and live
        delivery starts right after the last of them: no gap, no duplicate. Without it, only
        results published from now on are delivered.
        """
        loop = loop or asyncio.get_running_loop()
        with self._lock:
            if after_seq is None:
                replay = Replay((), False, None)
            else:
                replay = self._replay_locked(after_seq, source_id)
            sub = Subscription(
                self, source_id, loop, self._subscriber_queue_size, replay, self._seq
            )
            outbox = self._outboxes.get(loop)
            if outbox is None:
                outbox = self._outboxes[loop] = _Outbox(self, loop)
            outbox.subscribers.add(sub)
        return sub

    def _unregister(self, sub: Subscription) -> None:
        with self._lock:
            outbox = self._outboxes.get(sub._loop)
            if outbox is not None:
                outbox.subscribers.discard(sub)
                if not outbox.subscribers:
                    del self._outboxes[sub._loop]

    def _all_subscribers_locked(self) -> list[Subscription]:
        return [sub for outbox in self._outboxes.values() for sub in outbox.subscribers]

    @property
    def subscriber_count(self) -> int:
        with self._lock:
            return len(self._all_subscribers_locked())

    def remove_source(self, source_id: str) -> None:
        """A source stopped here: forgotten (`forget_source`), unless an outlet takes this
        process's results (a fleet node), where the fleet says when a stream is gone."""
        if self._outlet is None:
            self.forget_source(source_id)

    def forget_source(self, source_id: str) -> None:
        """Forget a removed source's latest result and history; end its subscriptions.

        Results already in the all-sources history stay there: they did happen. A later source
        with the same id starts with a gap marker, so a resume across the two is flagged.
        """
        with self._lock:
            latest = self._latest.pop(source_id, None)
            self._per_source.pop(source_id, None)
            if latest is not None:
                self._evicted_through[source_id] = latest.seq
            ending = [s for s in self._all_subscribers_locked() if s.source_id == source_id]
        for sub in ending:
            sub._end_threadsafe(SubscriptionEnd.SOURCE_REMOVED)

    def close(self) -> None:
        """End every subscription (on shutdown)."""
        with self._lock:
            ending = self._all_subscribers_locked()
        for sub in ending:
            sub._end_threadsafe(SubscriptionEnd.CLOSED)
