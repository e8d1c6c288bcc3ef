"""Event snapshots: a JPEG of each frame whose result carried zone or line events, kept per
stream, so that an alert can show what happened (`GET /v1/streams/{id}/snapshots/{frame}.jpg`;
the webhook and MQTT bodies name it).

The stream manager's publisher thread offers every such frame with its result (`offer`, which
never blocks); one encoder thread draws the result's boxes on it, scales it down to
`max_width`, encodes it and keeps the last `per_stream` of each stream, by frame index (the
number a worker process knows its frames by; the result's seq is given in the API process).
A frame waiting to be encoded holds its decoded picture (a 1080p frame is 3 MB of GPU or 6 MB
of host memory), so the queue is short: a frame offered while it is full gets no snapshot and
is counted as skipped. A busy scene then keeps some of its event frames, never stalls the
streams, and memory stays bounded (`per_stream` JPEGs per stream, `queue` frames waiting).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from vdet.config.event_snapshots import EventSnapshotSettings
from vdet.core.types import DecodedFrame, DetectionResult, ImageArray, ZoneEvent
from vdet.streams.pictures import encode_frame

log = logging.getLogger(__name__)

# (source id, frame) -> the frame as a BGR host image: the stream manager's `host_image`.
ToHostImage = Callable[[str, DecodedFrame], ImageArray]


def snapshot_path(source_id: str, frame_index: int) -> str:
    """Where the event snapshot of a stream's frame is served, relative to the service: the
    route that answers it and the notifications that name it agree on this one form."""
    return f"/v1/streams/{source_id}/snapshots/{frame_index}.jpg"


@dataclass(frozen=True)
class EventSnapshotInfo:
    """What an event snapshot shows, without its JPEG (a stream's listing)."""

    source_id: str
    frame_index: int
    pts_seconds: float | None
    arrival_time: float
    events: tuple[ZoneEvent, ...]
    width: int  # of the JPEG
    height: int
    jpeg_bytes: int


@dataclass(frozen=True)
class EventSnapshot:
    """One event frame of a stream, encoded with its boxes drawn."""

    info: EventSnapshotInfo
    jpeg: bytes


@dataclass(frozen=True)
class EventSnapshotCounts:
    """Since the start: snapshots kept, frames skipped (the queue full) and encodes failed."""

    kept: int = 0
    skipped: int = 0
    failed: int = 0


class EventSnapshots:
    """The encoder thread and what it keeps (module docstring). Thread-safe."""

    def __init__(
        self, settings: EventSnapshotSettings, names: Sequence[str], to_host_image: ToHostImage
    ) -> None:
        self._settings = settings
        self._names = tuple(names)
        self._to_host_image = to_host_image
        self._queue: queue.Queue[tuple[int, DetectionResult, DecodedFrame] | None] = queue.Queue(
            maxsize=settings.queue
        )
        self._lock = threading.Lock()  # guards the fields below
        self._done = threading.Condition(self._lock)  # a waiting frame was encoded (or not)
        self._kept: dict[str, OrderedDict[int, EventSnapshot]] = {}
        # Frames queued or being encoded: a GET for one waits for it (a webhook receiver that
        # asks at once may ask before the encoder is done).
        self._waiting: set[tuple[str, int]] = set()
        # Each stream's generation: a number of its own, dropped when it is forgotten, so a
        # frame of it still being encoded then is not kept (and a stream added again under its
        # id, which gets a new number, starts empty); forgotten ids leave nothing behind.
        self._generation: dict[str, int] = {}
        self._generations = itertools.count(1)
        self._counts: dict[str, EventSnapshotCounts] = {}
        self._thread = threading.Thread(target=self._run, name="event-snapshots", daemon=True)
        self._thread.start()

    def offer(self, result: DetectionResult, frame: DecodedFrame) -> None:
        """Snapshot `frame` if `result` has events and the queue has room; never blocks."""
        if not result.events:
            return
        source, key = result.source_id, (result.source_id, result.frame_index)
        with self._lock:
            generation = self._generation.get(source)
            if generation is None:
                generation = self._generation[source] = next(self._generations)
            self._waiting.add(key)
        try:
            self._queue.put_nowait((generation, result, frame))
        except queue.Full:
            self._settle(key)
            self._count(source, generation, skipped=1)

    def get(self, source_id: str, frame_index: int, wait_s: float = 1.0) -> EventSnapshot | None:
        """The snapshot of the stream's frame, if kept; waits up to `wait_s` for one that is
        still being encoded."""
        key = (source_id, frame_index)
        with self._lock:
            self._done.wait_for(lambda: key not in self._waiting, timeout=wait_s)
            kept = self._kept.get(source_id)
            return None if kept is None else kept.get(frame_index)

    def list(self, source_id: str) -> list[EventSnapshotInfo]:
        """The stream's snapshots kept now, oldest first."""
        with self._lock:
            return [snap.info for snap in self._kept.get(source_id, {}).values()]

    def counts(self, source_id: str) -> EventSnapshotCounts:
        with self._lock:
            return self._counts.get(source_id, EventSnapshotCounts())

    def forget(self, source_id: str) -> None:
        """Drop a removed stream's snapshots and counts, and any of its frames still queued."""
        with self._lock:
            self._kept.pop(source_id, None)
            self._counts.pop(source_id, None)
            self._generation.pop(source_id, None)

    def close(self) -> None:
        """Stop the encoder thread; frames still queued are dropped."""
        while True:  # make room for the stop mark without blocking on a full queue
            try:
                self._queue.put_nowait(None)
                break
            except queue.Full:
                with contextlib.suppress(queue.Empty):
                    self._queue.get_nowait()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            generation, result, frame = item
            del item
            snapshot: EventSnapshot | None = None
            try:
                snapshot = self._encode(result, frame)
            except Exception:  # one frame that cannot be encoded must not stop the others
                if self._current(result.source_id, generation):  # else: its stream was removed
                    log.exception(
                        "event snapshot of %s frame %d failed", result.source_id, result.frame_index
                    )
                    self._count(result.source_id, generation, failed=1)
            finally:
                del frame  # the decoded picture goes now, not when the next frame comes
            if snapshot is not None:
                self._keep(generation, snapshot)
            self._settle((result.source_id, result.frame_index))

    def _encode(self, result: DetectionResult, frame: DecodedFrame) -> EventSnapshot:
        image = self._to_host_image(result.source_id, frame)
        jpeg, (width, height) = encode_frame(
            image,
            result.detections,
            self._names,
            quality=self._settings.quality,
            max_width=self._settings.max_width,
        )
        info = EventSnapshotInfo(
            source_id=result.source_id,
            frame_index=result.frame_index,
            pts_seconds=result.pts_seconds,
            arrival_time=result.arrival_time,
            events=result.events,
            width=width,
            height=height,
            jpeg_bytes=len(jpeg),
        )
        return EventSnapshot(info, jpeg)

    def _keep(self, generation: int, snapshot: EventSnapshot) -> None:
        source, index = snapshot.info.source_id, snapshot.info.frame_index
        with self._lock:
            if self._generation.get(source) != generation:
                return  # its stream was removed while it was encoded
            kept = self._kept.setdefault(source, OrderedDict())
            kept[index] = snapshot
            kept.move_to_end(index)
            while len(kept) > self._settings.per_stream:
                kept.popitem(last=False)
        self._count(source, generation, kept=1)

    def _settle(self, key: tuple[str, int]) -> None:
        with self._lock:
            self._waiting.discard(key)
            self._done.notify_all()

    def _current(self, source_id: str, generation: int) -> bool:
        with self._lock:
            return self._generation.get(source_id) == generation

    def _count(
        self, source_id: str, generation: int, *, kept: int = 0, skipped: int = 0, failed: int = 0
    ) -> None:
        with self._lock:
            if self._generation.get(source_id) != generation:
                return
            now = self._counts.get(source_id, EventSnapshotCounts())
            self._counts[source_id] = EventSnapshotCounts(
                now.kept + kept, now.skipped + skipped, now.failed + failed
            )


__all__ = [
    "EventSnapshot",
    "EventSnapshotCounts",
    "EventSnapshotInfo",
    "EventSnapshots",
    "ToHostImage",
]
