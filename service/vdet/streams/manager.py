"""The stream manager: the set of running streams and the threads that serve each one.

A stream is a `FrameMailbox` fed by a supervised `SourceThread` (ingest) and drained by one
pipeline thread here, which runs the shared `Detector` with the stream's own thresholds; one
publisher thread for all streams numbers each result in the `ResultsHub`, keeps the stream's
snapshot and reports to `Metrics` (a single writer: see `StreamManager.__init__`). With a
GPU side (`GpuSide`, vdet.gpu.devices.GpuPool), each new stream is placed on one GPU device:
its reader comes from that device (NVDEC on that GPU), and its frames in GPU memory go to that
device's CUDA graphs; frames in host memory (a codec NVDEC cannot decode) still go to the
`Detector`.

This module owns adding, changing and removing streams and their threads' lifetimes; it does
not decode, run models, or speak HTTP. Every method may block briefly (locks, thread joins):
call it from a thread, never from the event loop.
"""

from __future__ import annotations

import builtins
import collections
import contextlib
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

from vdet.clips.recorder import ClipRecorder, ClipWriter
from vdet.clips.store import ClipStore
from vdet.config.clips import ClipSettings
from vdet.config.event_snapshots import EventSnapshotSettings
from vdet.config.ingest import IngestSettings
from vdet.config.streams import DetectionDefaults, StreamSpec
from vdet.config.tracking import TrackingSpec, ZoneSpec
from vdet.core.rates import RateMeter
from vdet.core.redact import redact
from vdet.core.types import (
    DecodedFrame,
    DetectionResult,
    Detections,
    ImageArray,
    SourceState,
    SourceStatus,
    StageTimings,
    TrackingSummary,
    VideoFrame,
    ZoneEvent,
)
from vdet.inference.class_thresholds import ClassThresholds
from vdet.inference.postprocess import PostprocessParams
from vdet.ingest.mailbox import FrameMailbox
from vdet.ingest.reader import SourceReader
from vdet.ingest.source_thread import IngestOptions, ReaderFactory, SourceThread
from vdet.ingest.urls import SourcePolicy, validate_source_url
from vdet.metrics.registry import Metrics
from vdet.streams.event_snapshots import (
    EventSnapshot,
    EventSnapshotCounts,
    EventSnapshotInfo,
    EventSnapshots,
)
from vdet.streams.params import (
    detect_params,
    resolve_classes,
    stream_class_thresholds,
    stream_params,
)
from vdet.streams.service import (
    DuplicateStreamError,
    LimitError,
    StreamChanges,
    StreamError,
    StreamView,
    UnknownStreamError,
)
from vdet.tracking.bytetrack import TrackerParams
from vdet.tracking.masks import drop_masked, without_masks
from vdet.tracking.stream_tracking import StreamTracking
from vdet.tracking.zones import Zone, check_in_frame, resolve_zones

log = logging.getLogger(__name__)

# How long the pipeline thread waits for a frame before checking whether it should stop.
_POLL_S = 0.2
# ... and, while a frame is in detection, before checking whether its result is ready.
_IN_FLIGHT_POLL_S = 0.002
# Counters of the source thread are folded into metrics at most this often per stream.
_METRICS_SYNC_S = 0.5
# Results waiting for the publisher thread, per stream the manager may hold.
_OUTBOX_PER_STREAM = 4
# Results the publisher thread takes from the outbox at once before flushing the sink.
_PUBLISH_BATCH = 64
# Host frames a stream detecting several at once (CPU sessions side by side) may take from its
# mailbox beyond those in detection, to start as soon as a detection ends. Near full load two
# frames often come while every detection is busy; with only the mailbox's slot the first is
# overwritten. One more costs at most a frame interval of latency and saved most of the drops
# of the demo stream on 2 cores (docs/benchmarks.md).
_QUEUED_HOST_FRAMES = 1


class DetectorLike(Protocol):
    """What the manager needs of `vdet.inference.detector.Detector`."""

    def detect(
        self, images_bgr: Sequence[ImageArray], params: PostprocessParams | None = None
    ) -> list[tuple[Detections, StageTimings]]: ...


class ResultSink(Protocol):
    """Where published results go: the `ResultsHub` in this process, or (in a stream worker
    process) the channel to the API process's hub (vdet.workers.child)."""

    def publish(self, result: DetectionResult) -> DetectionResult: ...

    def flush(self) -> None:
        """Hand on what `publish` has kept back: called after each run of results the
        publisher thread took at once (a worker process's sink sends them as one message)."""

    def remove_source(self, source_id: str) -> None: ...


class GpuDeviceLike(Protocol):
    """What the manager needs of one GPU device (vdet.gpu.devices.GpuDevice)."""

    label: str

    @property
    def open_reader(self) -> ReaderFactory: ...

    def detect(
        self, source_id: str, frame: Any, params: PostprocessParams
    ) -> tuple[Detections, StageTimings]: ...

    def to_bgr(self, frame: Any) -> ImageArray: ...

    def memory_bytes(self) -> int: ...

    @property
    def frames_in_flight(self) -> int: ...


class GpuSide(Protocol):
    """What the manager needs of the GPU devices (vdet.gpu.devices.GpuPool)."""

    @property
    def devices(self) -> Sequence[GpuDeviceLike]: ...

    def place(self, source_id: str, pinned_gpu: int | None = None) -> GpuDeviceLike: ...

    def release(self, source_id: str) -> None: ...

    def streams_by_gpu(self) -> dict[str, int]: ...


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """A frame of a stream with a result: the last processed frame and its own result, or
    (`StreamManager.newest_frame`) a newer decoded frame and the newest result."""

    frame: DecodedFrame
    result: DetectionResult


class _Stream:
    """One stream's parts. `lock` guards the mutable fields below it."""

    def __init__(
        self,
        spec: StreamSpec,
        params: PostprocessParams,
        url: str,
        zones: tuple[Zone, ...],
        unpaced_queue_frames: int = 1,
    ) -> None:
        self.spec = spec
        self.url = url
        self.mailbox = FrameMailbox(lossless_depth=unpaced_queue_frames)
        self.mailbox.set_detect_fps(spec.detect_fps)
        self.stop = threading.Event()
        self.source: SourceThread | None = None
        self.gpu_device: GpuDeviceLike | None = None
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()
        self.params = params
        self.zones = zones
        self.class_thresholds: ClassThresholds | None = None
        self.detect_params = params  # params, at class_thresholds' floor when it has one
        # Touched by the pipeline thread only: tracks live and die with their stream.
        self.tracking = StreamTracking()
        self.closed = False
        self.frames_processed = 0
        self.processed_rate = RateMeter()
        self.snapshot: Snapshot | None = None
        self.pipeline_error: str | None = None
        self.recorder: ClipRecorder | None = None  # with clips on: its pre-roll and clip
        # Set, under the manager's lock, once remove() has begun: the stream is gone for
        # readers but keeps its id (and its slot) until it has stopped, so a concurrent add
        # of the same id cannot have its hub entries or metric series wiped by this removal.
        self.removing = False


@dataclasses.dataclass(frozen=True)
class _Outgoing:
    """A detected frame on its way from a pipeline thread to the publisher thread."""

    stream: _Stream
    frame: DecodedFrame
    detections: Detections
    timings: StageTimings
    events: tuple[ZoneEvent, ...] = ()
    tracking: TrackingSummary | None = None


@dataclasses.dataclass(frozen=True)
class _InFlight:
    """A frame taken from its mailbox, its detection (running or done), and the stream's
    tracking settings when it was taken."""

    frame: DecodedFrame
    result: Future[tuple[Detections, StageTimings]]
    tracking: TrackingSpec
    zones: tuple[Zone, ...]
    class_thresholds: ClassThresholds | None = None


class StreamManager:
    """Owns every stream. Thread-safe; every method may block briefly (see module docstring)."""

    def __init__(
        self,
        detector: DetectorLike,
        class_names: Sequence[str],
        hub: ResultSink,
        metrics: Metrics,
        *,
        max_streams: int,
        defaults: DetectionDefaults | None = None,
        ingest: IngestSettings | None = None,
        gpu: GpuSide | None = None,
        clock: Callable[[], float] = time.time,
        parallel_frames: int = 1,
        event_snapshots: EventSnapshotSettings | None = None,
        clips: ClipSettings | None = None,
        unpaced_queue_frames: int = 1,
    ) -> None:
        if parallel_frames < 1:
            raise ValueError(f"parallel_frames must be >= 1, got {parallel_frames}")
        self._detector = detector
        # Frames of one stream in detection at once (the detector's `parallel_frames`): on a
        # CPU backend with several sessions, the next frame starts before the last one ends.
        self._parallel_frames = parallel_frames
        self._gpu = gpu
        self._names = tuple(class_names)
        self._hub = hub
        self._metrics = metrics
        self._max_streams = max_streams
        self._defaults = defaults or DetectionDefaults()
        self._ingest = ingest or IngestSettings()
        # Frames an unpaced file (realtime off) may decode ahead of detection: one, so decoding
        # and detection take turns; more was no faster (docs/benchmarks.md), at a frame's
        # memory each. Not a setting; the tests and the lab pass others.
        self._unpaced_queue_frames = unpaced_queue_frames
        self._clock = clock
        self._lock = threading.Lock()  # guards _streams and _closed
        self._streams: dict[str, _Stream] = {}
        self._closed = False
        # Every stream's pipeline thread hands its results to ONE publisher thread: the hub's
        # lock (it numbers results in order) then has one writer. A lock that dozens of
        # pipeline threads take per frame serialises them at the rate each waiting thread
        # wins the GIL back (~250/s with 32 streams: measured, see docs/gpu-data-path.md).
        # Bounded: a publisher that falls behind (a slow result sink) holds the pipelines back,
        # so paced sources drop at their mailboxes and unpaced files decode slower, instead of
        # results piling up here without limit, each holding its frame (a 1080p frame is 3 MB
        # of GPU memory) and each later than the last (seen with 64 unpaced streams).
        self._outbox: queue.Queue[_Outgoing | None] = queue.Queue(
            maxsize=_OUTBOX_PER_STREAM * max(1, max_streams)
        )
        snapshots = event_snapshots or EventSnapshotSettings()
        self._event_snapshots = (
            EventSnapshots(snapshots, self._names, self.host_image)
            if snapshots.per_stream > 0
            else None
        )
        store = ClipStore.of(clips) if clips is not None else None
        self._clips = clips if store is not None else None
        self._clip_writer = (
            ClipWriter(clips, store, self._metrics.observe_clip)
            if clips is not None and store is not None
            else None
        )
        self._publisher = threading.Thread(
            target=self._publish_loop, name="vdet-publisher", daemon=True
        )
        self._publisher.start()

    @property
    def class_names(self) -> tuple[str, ...]:
        return self._names

    @property
    def defaults(self) -> DetectionDefaults:
        return self._defaults

    # --- lifecycle -------------------------------------------------------------------------

    def add(self, spec: StreamSpec) -> StreamView:
        """Validate and start a stream.

        Raises ValueError (bad URL or class names), DuplicateStreamError, LimitError.
        """
        url = validate_source_url(spec.url, SourcePolicy.of(self._ingest.source_policy))
        params = self._params_for(spec)
        thresholds = stream_class_thresholds(spec, params, self._names)
        stream = _Stream(
            spec,
            params,
            url,
            self._zones_for(spec.zones),
            unpaced_queue_frames=self._unpaced_queue_frames,
        )
        stream.class_thresholds = thresholds
        stream.detect_params = detect_params(params, thresholds)
        with self._lock:
            if self._closed:
                raise StreamError("the stream manager is shut down")
            if (existing := self._streams.get(spec.id)) is not None:
                state = "is still being removed" if existing.removing else "already exists"
                raise DuplicateStreamError(f"stream {spec.id!r} {state}")
            if len(self._streams) >= self._max_streams:
                raise LimitError(
                    f"stream limit reached ({self._max_streams}); delete a stream first"
                )
            self._streams[spec.id] = stream  # reserved: a concurrent add of the id fails
        try:
            self._start(stream)
        except BaseException:
            with self._lock:
                self._streams.pop(spec.id, None)
            self._stop(stream)
            raise
        self._metrics.streams.set(len(self))
        log.info("stream %s added (%s)", spec.id, redact(url))
        return self._view(stream)

    def _start(self, stream: _Stream) -> None:
        source_id = stream.spec.id
        gpu_device = None
        if self._gpu is not None:  # a PlacementError (ValueError) says why it cannot run
            gpu_device = self._gpu.place(source_id, stream.spec.gpu)
        with stream.lock:
            stream.gpu_device = gpu_device
        label = gpu_device.label if gpu_device is not None else "cpu"
        self._metrics.add_source(source_id, SourceState.CONNECTING, gpu=label)
        recorder = (
            ClipRecorder(source_id, self._clips, self._clip_writer, self._names)
            if self._clips is not None and self._clip_writer is not None
            else None
        )
        with stream.lock:
            stream.recorder = recorder
        source = SourceThread(
            source_id,
            stream.url,
            stream.mailbox,
            IngestOptions.of(
                self._ingest, loop_files=stream.spec.loop, realtime=stream.spec.realtime
            ),
            on_state_change=self._on_state_change,
            reader_factory=gpu_device.open_reader if gpu_device is not None else SourceReader,
            packet_tap=recorder.on_packet if recorder is not None and recorder.enabled else None,
        )
        thread = threading.Thread(
            target=self._run_pipeline, args=(stream,), name=f"vdet-pipeline-{source_id}"
        )
        thread.daemon = True
        with stream.lock:
            # A concurrent remove() of this id may have closed the stream already; then
            # nothing may be started, since that remove() will not come back to stop it.
            if stream.closed:
                raise StreamError(f"stream {source_id!r} was removed while starting")
            thread.start()
            source.start()
            stream.thread, stream.source = thread, source

    def remove(self, stream_id: str) -> None:
        """Stop a stream and forget it, its latest result and its metric series."""
        with self._lock:
            stream = self._streams.get(stream_id)
            if stream is None or stream.removing:
                raise UnknownStreamError(f"no stream {stream_id!r}")
            stream.removing = True
        try:
            self._stop(stream)
        finally:
            with self._lock:
                self._streams.pop(stream_id, None)
        self._metrics.streams.set(len(self))
        log.info("stream %s removed", stream_id)

    def _stop(self, stream: _Stream, timeout: float = 5.0) -> None:
        with stream.lock:
            stream.closed = True  # from here on nothing of this stream is published or counted
            source, thread = stream.source, stream.thread
        stream.stop.set()
        if source is not None:
            source.stop(timeout)
        stream.mailbox.close()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            if thread.is_alive():
                log.warning("pipeline thread of %s did not stop in %.1fs", stream.spec.id, timeout)
        self._hub.remove_source(stream.spec.id)
        self._metrics.remove_source(stream.spec.id)
        if self._event_snapshots is not None:
            self._event_snapshots.forget(stream.spec.id)
        if stream.recorder is not None:
            stream.recorder.close()  # a clip in progress is written with what it has
        if self._gpu is not None:
            self._gpu.release(stream.spec.id)

    def close(self) -> None:
        """Stop every stream; later adds fail. Idempotent."""
        with self._lock:
            first = not self._closed
            self._closed = True
            streams = list(self._streams.values())
            self._streams.clear()
        for stream in streams:  # each stop interrupts its source's blocking call: quick
            self._stop(stream)
        self._metrics.streams.set(0)
        if first:
            with contextlib.suppress(queue.Full):  # a wedged publisher is not waited for
                self._outbox.put(None, timeout=5.0)
            self._publisher.join(5.0)
            if self._event_snapshots is not None:
                self._event_snapshots.close()
            if self._clip_writer is not None:
                self._clip_writer.close()

    # --- queries and changes ---------------------------------------------------------------

    def get(self, stream_id: str) -> StreamView:
        return self._view(self._stream(stream_id))

    def list(self) -> list[StreamView]:
        with self._lock:
            streams = sorted(
                (s for s in self._streams.values() if not s.removing), key=lambda s: s.spec.id
            )
        return [self._view(s) for s in streams]

    def __len__(self) -> int:
        """Streams holding a slot (those still being removed included)."""
        with self._lock:
            return len(self._streams)

    def __contains__(self, stream_id: object) -> bool:
        with self._lock:
            stream = self._streams.get(stream_id) if isinstance(stream_id, str) else None
            return stream is not None and not stream.removing

    def snapshot(self, stream_id: str) -> Snapshot | None:
        """The last processed frame and its result, or None before the first."""
        stream = self._stream(stream_id)
        with stream.lock:
            return stream.snapshot

    def snapshot_image(self, stream_id: str) -> tuple[ImageArray, DetectionResult] | None:
        """The last processed frame as a BGR host image, with its result; None before one."""
        snap = self.snapshot(stream_id)
        if snap is None:
            return None
        return self.host_image(stream_id, snap.frame), snap.result

    def event_snapshot(self, stream_id: str, frame_index: int) -> EventSnapshot | None:
        """The JPEG of a frame of the stream that had events (vdet.streams.event_snapshots), while
        it is kept; None otherwise. Raises UnknownStreamError."""
        self._stream(stream_id)
        if self._event_snapshots is None:
            return None
        return self._event_snapshots.get(stream_id, frame_index)

    def event_snapshots(
        self, stream_id: str
    ) -> tuple[builtins.list[EventSnapshotInfo], EventSnapshotCounts]:
        """The stream's event snapshots kept now (oldest first) and its counts. Raises
        UnknownStreamError."""
        self._stream(stream_id)
        if self._event_snapshots is None:
            return [], EventSnapshotCounts()
        return (
            self._event_snapshots.list(stream_id),
            self._event_snapshots.counts(stream_id),
        )

    def event_snapshot_counts(self, stream_id: str) -> EventSnapshotCounts:
        """Since the stream started: its event snapshots kept, skipped and failed."""
        if self._event_snapshots is None:
            return EventSnapshotCounts()
        return self._event_snapshots.counts(stream_id)

    def newest_frame(self, stream_id: str) -> Snapshot | None:
        """The newest decoded frame, with the newest result (detected on it or on an earlier
        frame); None before the first result.

        That is the frame in host memory last put into the stream's mailbox when it is newer
        than the last processed one, else the last processed one (so always, for frames in GPU
        memory): what a live view shows to run at the decode rate, not the detection rate.
        """
        stream = self._stream(stream_id)
        with stream.lock:
            snap = stream.snapshot
        if snap is None:
            return None
        newest = stream.mailbox.newest_on_host
        if newest is not None and newest.index > snap.frame.index:
            return Snapshot(newest, snap.result)
        return snap

    def host_image(self, stream_id: str, frame: DecodedFrame) -> ImageArray:
        """`frame` of `stream_id` as a BGR image in host memory (a GPU frame is downloaded)."""
        if isinstance(frame, VideoFrame):
            return frame.image_bgr
        stream = self._stream(stream_id)
        with stream.lock:
            gpu_device = stream.gpu_device
        if gpu_device is None:
            raise RuntimeError(f"stream {stream_id!r} has a GPU frame but no GPU device")
        return gpu_device.to_bgr(frame)

    def change(self, stream_id: str, changes: StreamChanges) -> StreamView:
        """Apply `changes` to a running stream from its next frame (StreamChanges says what a
        field left out or null means). Raises ValueError (pydantic's ValidationError is one)
        for unknown classes or a zone outside the frame, UnknownStreamError."""
        stream = self._stream(stream_id)
        frame_wh = self._frame_size(stream)
        with stream.lock:
            spec = changes.applied_to(stream.spec)
            params, zones = self._params_for(spec), self._zones_for(spec.zones, frame_wh)
            thresholds = stream_class_thresholds(spec, params, self._names)
            stream.params, stream.zones, stream.spec = params, zones, spec
            stream.class_thresholds = thresholds
            stream.detect_params = detect_params(params, thresholds)
            stream.mailbox.set_detect_fps(spec.detect_fps)
        return self._view(stream)

    def sync_metrics(self) -> None:
        """Fold every stream's source counters into metrics (call before a scrape)."""
        with self._lock:
            streams = list(self._streams.values())
        for stream in streams:
            self._sync_stream_metrics(stream)
        if self._gpu is None:
            self._metrics.set_gpu_usage("cpu", streams=len(streams))
        else:
            counts = self._gpu.streams_by_gpu()
            for gpu_device in self._gpu.devices:
                self._metrics.set_gpu_usage(
                    gpu_device.label,
                    streams=counts.get(gpu_device.label, 0),
                    memory_bytes=gpu_device.memory_bytes(),
                )

    # --- internals -------------------------------------------------------------------------

    def _stream(self, stream_id: str) -> _Stream:
        with self._lock:
            stream = self._streams.get(stream_id)
        if stream is None or stream.removing:
            raise UnknownStreamError(f"no stream {stream_id!r}")
        return stream

    def _params_for(self, spec: StreamSpec) -> PostprocessParams:
        return stream_params(spec, self._defaults, self._names)

    def _zones_for(
        self, specs: Sequence[ZoneSpec], frame_wh: tuple[int, int] | None = None
    ) -> tuple[Zone, ...]:
        """Zones with class ids; pixel zones checked against the frame size when known."""
        zones = resolve_zones(specs, lambda refs: resolve_classes(refs, self._names))
        if frame_wh is not None:
            check_in_frame(specs, frame_wh)
        return zones

    def _frame_size(self, stream: _Stream) -> tuple[int, int] | None:
        with stream.lock:
            source = stream.source
        status = source.status() if source is not None else None
        if status is None or not status.width or not status.height:
            return None
        return status.width, status.height

    def _view(self, stream: _Stream) -> StreamView:
        with stream.lock:
            spec, params, source = stream.spec, stream.params, stream.source
            processed, error = stream.frames_processed, stream.pipeline_error
            fps_processed = stream.processed_rate.rate(time.monotonic())
        status = source.status() if source is not None else SourceStatus()
        age = None
        if status.last_frame_time is not None:
            age = max(0.0, self._clock() - status.last_frame_time)
        return StreamView(
            spec=spec,
            params=params,
            status=status,
            frames_processed=processed,
            last_frame_age_s=age,
            pipeline_error=error,
            fps_processed=fps_processed,
        )

    def _on_state_change(self, source_id: str, old: SourceState, new: SourceState) -> None:
        # Called on the source thread. Metrics ignore sources already removed.
        log.info("source %s: %s -> %s", source_id, old, new)
        self._metrics.set_source_state(source_id, new)

    def _sync_stream_metrics(self, stream: _Stream) -> None:
        with stream.lock:
            source = stream.source
        if source is not None:
            self._metrics.sync_source(stream.spec.id, source.status(), now=self._clock())
        counts = self.event_snapshot_counts(stream.spec.id)
        self._metrics.sync_event_snapshots(
            stream.spec.id, counts.kept, counts.skipped, counts.failed
        )

    def _run_pipeline(self, stream: _Stream) -> None:
        """The stream's pipeline thread: mailbox -> detector -> hub + metrics, until stopped.

        With `parallel_frames` > 1, frames decoded on the CPU go to the detector from a pool of
        that many threads, so the next frame is taken (and detected) while earlier ones are
        still in detection; so do a GPU stream's frames when its device takes more than one
        at a time (`frames_in_flight`: a batching device). Results are tracked and published in
        the order frames were taken.
        """
        with stream.lock:
            gpu_device = stream.gpu_device
        gpu_depth = gpu_device.frames_in_flight if gpu_device is not None else 1
        depth = max(self._parallel_frames, gpu_depth)
        if depth == 1:
            self._pipeline_loop(stream, None, 1)
            return
        # A GPU stream's frames hold decoder surfaces: none is taken before it can start.
        taken = depth + (_QUEUED_HOST_FRAMES if gpu_device is None else 0)
        with ThreadPoolExecutor(depth, thread_name_prefix=f"vdet-detect-{stream.spec.id}") as pool:
            self._pipeline_loop(stream, pool, taken)

    def _pipeline_loop(self, stream: _Stream, pool: ThreadPoolExecutor | None, taken: int) -> None:
        """Take frames while fewer than `taken` are in detection or waiting for it; finish
        (track, hand to the publisher) each in the order taken."""
        in_flight: collections.deque[_InFlight] = collections.deque()
        next_sync = 0.0
        while not stream.stop.is_set():
            if in_flight and (len(in_flight) >= taken or in_flight[0].result.done()):
                self._finish(stream, in_flight.popleft())
                continue
            frame = stream.mailbox.get(timeout=_IN_FLIGHT_POLL_S if in_flight else _POLL_S)
            now = time.monotonic()
            if now >= next_sync:
                self._sync_stream_metrics(stream)
                next_sync = now + _METRICS_SYNC_S
            if frame is None:
                if stream.mailbox.closed and not in_flight:
                    break
                continue
            in_flight.append(self._start_detection(stream, frame, pool))

    def _start_detection(
        self, stream: _Stream, frame: DecodedFrame, pool: ThreadPoolExecutor | None
    ) -> _InFlight:
        """Detect `frame` with the stream's current settings: in `pool` when given, else here
        and now."""
        with stream.lock:
            params, gpu_device = stream.detect_params, stream.gpu_device
            tracking, zones = stream.spec.tracking, stream.zones
            thresholds = stream.class_thresholds
        result: Future[tuple[Detections, StageTimings]]
        if isinstance(frame, VideoFrame) and pool is not None:
            result = pool.submit(self._detect_one, frame.image_bgr, params)
        elif gpu_device is not None and pool is not None:
            result = pool.submit(gpu_device.detect, stream.spec.id, frame, params)
        else:
            result = Future()
            try:
                if isinstance(frame, VideoFrame):
                    result.set_result(self._detect_one(frame.image_bgr, params))
                elif gpu_device is not None:
                    result.set_result(gpu_device.detect(stream.spec.id, frame, params))
                else:
                    raise RuntimeError(f"{type(frame).__name__} on a stream without a GPU device")
            except Exception as exc:
                result.set_exception(exc)
        return _InFlight(frame, result, tracking, zones, thresholds)

    def _detect_one(
        self, image_bgr: ImageArray, params: PostprocessParams
    ) -> tuple[Detections, StageTimings]:
        ((detections, timings),) = self._detector.detect([image_bgr], params)
        return detections, timings

    def _finish(self, stream: _Stream, item: _InFlight) -> None:
        """Track a detected frame and hand it to the publisher; log a failure once."""
        frame, tracking = item.frame, item.tracking
        masks, zones = without_masks(item.zones)
        try:
            detections, timings = item.result.result()
            if item.class_thresholds is not None:
                detections = item.class_thresholds.keep(detections)
            detections = drop_masked(detections, frame.size_wh, masks)
            outgoing = _Outgoing(stream, frame, detections, timings)
            if tracking.enabled:
                tracked = stream.tracking.update(
                    detections, frame.size_wh, frame.arrival_time, TrackerParams.of(tracking), zones
                )
                outgoing = dataclasses.replace(
                    outgoing,
                    detections=tracked.detections,
                    events=tracked.events,
                    tracking=tracked.summary,
                )
            else:
                stream.tracking.reset()
        except Exception as exc:  # keep serving: one bad frame must not end the stream
            error = f"{type(exc).__name__}: {exc}"
            with stream.lock:
                repeated, stream.pipeline_error = stream.pipeline_error == error, error
            if not repeated:  # a broken model fails every frame: log each new error once
                log.exception(
                    "detection or tracking failed on %s frame %d", stream.spec.id, frame.index
                )
            return
        self._outbox.put(outgoing)

    def _publish_loop(self) -> None:
        """The publisher thread: results -> hub, snapshot, counts and metrics, in the order
        each stream produced them, until close(). It takes every result waiting (up to
        `_PUBLISH_BATCH`) and flushes the sink once after them, so a sink that sends (a worker
        process's pipe) pays for a system call, and the GIL wait after it, once per run of
        results instead of once per result."""
        while True:
            batch = [self._outbox.get()]
            with contextlib.suppress(queue.Empty):
                while len(batch) < _PUBLISH_BATCH:
                    batch.append(self._outbox.get_nowait())
            for item in batch:
                if item is None:
                    self._flush()
                    return
                try:
                    self._publish(item)
                except Exception:  # one bad result must not stop every stream's publishing
                    log.exception("publishing a result of %s failed", item.stream.spec.id)
            self._flush()

    def _flush(self) -> None:
        try:
            self._hub.flush()
        except Exception:  # e.g. the API process has gone; keep serving what remains
            log.exception("handing published results on failed")

    def _publish(self, item: _Outgoing) -> None:
        stream, frame = item.stream, item.frame
        published = self._clock()
        timings = dataclasses.replace(
            item.timings,
            decode=frame.decode_seconds,
            end_to_end=max(0.0, published - frame.arrival_time),
        )
        result = DetectionResult(
            source_id=stream.spec.id,
            frame_index=frame.index,
            pts_seconds=frame.pts_seconds,
            arrival_time=frame.arrival_time,
            published_time=published,
            image_size_wh=frame.size_wh,
            detections=item.detections,
            timings=timings,
            events=item.events,
            tracking=item.tracking,
        )
        with stream.lock:
            if stream.closed:  # removed meanwhile: nothing of it is published any more
                return
            result = self._hub.publish(result)
            stream.snapshot = Snapshot(frame, result)
            stream.frames_processed += 1
            stream.processed_rate.add(time.monotonic())
            stream.pipeline_error = None
        self._metrics.observe_result(result)
        if self._event_snapshots is not None:
            self._event_snapshots.offer(result, frame)
        if result.events and stream.recorder is not None:
            stream.recorder.on_events(result.events, result.arrival_time)
