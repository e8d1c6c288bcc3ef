"""The composition root: the one place that turns `Settings` into the running system.

`Runtime(settings)` holds what lives as long as the service: the settings, the metrics and the
results hub. `start()` builds the rest in order: where the streams run (`StreamService`), then
the configured sources; `stop()` takes it down in reverse. Streams run either here, in this
process (`LocalStreams`: detector, GPU workers, stream manager), or in stream worker processes
behind this one (vdet.workers.pool.WorkerPool, chosen by `workers.processes`). The API's
lifespan, the benchmarks and each worker process assemble vdet only through this module.

It speaks no HTTP, and it blocks (model loading, process starts): call it from a thread, never
from the event loop.
"""

from __future__ import annotations

import asyncio
import builtins
import dataclasses
import logging
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

from vdet.config.settings import Settings
from vdet.config.streams import DetectionDefaults, StreamSpec
from vdet.core.assets import default_model_path, demo_cpu_int8_path
from vdet.core.types import Detections, ImageArray, SourceStatus, StageTimings
from vdet.inference.detector import Detector
from vdet.inference.postprocess import PostprocessParams
from vdet.ingest.urls import redact
from vdet.metrics.registry import Metrics
from vdet.results.hub import ResultsHub
from vdet.streams.event_snapshots import EventSnapshot, EventSnapshotCounts, EventSnapshotInfo
from vdet.streams.manager import ResultSink, StreamError, StreamManager, StreamView
from vdet.streams.store import (
    PersistentStreams,
    StartupPlan,
    StartupStream,
    StreamStore,
    plan_startup,
)
from vdet.tracking.compiled import warm_up as warm_up_tracking

if TYPE_CHECKING:
    from vdet.gpu.devices import GpuPool  # imports torch: only where a GPU backend runs
    from vdet.streams.pictures import EncodedFrame, Picture
    from vdet.workers.pool import WorkerPool

log = logging.getLogger(__name__)

DetectorFactory = Callable[[Settings], Detector]


def open_detector(settings: Settings, backend: str | None = None, **options: Any) -> Detector:
    """The detector for `settings`: its model on `backend` (default: the configured one, with
    backend `options`), with the default thresholds."""
    d = settings.detection
    params = PostprocessParams(
        conf_threshold=d.conf_threshold,
        iou_threshold=d.iou_threshold,
        top_k=d.top_k,
        max_det=d.max_det,
    )
    return Detector.open(
        settings.model_path,
        backend or settings.backend,
        params=params,
        input_shape=settings.input_shape,
        **options,
    )


# ONNX Runtime sessions of the service's detector on a CPU of 2 cores or more, unless
# `cpu_sessions` says otherwise: each stream keeps as many frames in detection at once (see
# OnnxRuntimeBackend and StreamManager).
CPU_SESSIONS = 2


def cpu_sessions(settings: Settings) -> int:
    """ONNX Runtime sessions for `settings`: `cpu_sessions`, else `CPU_SESSIONS` where there
    are that many cores, else 1."""
    if settings.cpu_sessions is not None:
        return settings.cpu_sessions
    return CPU_SESSIONS if _cores() >= CPU_SESSIONS else 1


def default_detector_factory(settings: Settings) -> Detector:
    """The configured detector; where that is ONNX Runtime (configured, or what `auto` chose),
    with `cpu_sessions` sessions, so that each stream keeps that many frames in detection
    (two: 1.78-1.87x the frames per second of one frame at a time on 2 busy cores, see
    bench/results/2026-12-03-cpu-vs-ultralytics.md)."""
    sessions = cpu_sessions(settings)
    if settings.backend == "onnxruntime":
        return open_detector(on_cpu(settings), sessions=sessions)
    detector = open_detector(settings)
    backend = detector.backend
    cpu = on_cpu(settings)
    if backend.name != "onnxruntime" or (
        backend.parallel_calls == sessions and cpu.model_path == settings.model_path
    ):
        return detector
    # `auto` chose ONNX Runtime: the other backends take no `sessions` (nor the CPU's model),
    # so it could not be asked for up front. Loading again costs a fraction of a second, once.
    detector.close()
    reopened = open_detector(cpu, "onnxruntime", sessions=sessions)
    reopened.backend.selection = backend.selection
    return reopened


def on_cpu(settings: Settings) -> Settings:
    """The settings to open ONNX Runtime with: the bundled demo model becomes its INT8 build
    (`cpu_int8_demo`), the one that keeps the demo stream near real time on 2 cores (FP32 24.7
    of 30 frames/s, INT8 29.8: bench/results/2026-12-04-cpu-int8.md); any other model as is."""
    int8 = demo_cpu_int8_path()
    if not (settings.cpu_int8_demo and int8.is_file() and _is_bundled_demo(settings.model_path)):
        return settings
    log.info("ONNX Runtime runs the bundled demo model's INT8 build %s (cpu_int8_demo)", int8.name)
    return settings.model_copy(update={"model_path": int8})


def _is_bundled_demo(path: os.PathLike[str] | str) -> bool:
    try:
        return os.path.samefile(path, default_model_path())
    except OSError:
        return False


def _cores() -> int:
    return os.cpu_count() or 1


@dataclasses.dataclass(frozen=True)
class BackendInfo:
    """What serves detections: reported by `vdet_backend`, /readyz and the start-up log."""

    backend: str
    device: str
    model: str
    precision: str
    class_names: tuple[str, ...]
    # "gpu": NVDEC, our kernels, CUDA graphs; "cpu": CPU decode, every frame through Detector.
    data_path: Literal["gpu", "cpu"] = "cpu"
    selection: str = ""  # why this backend serves (what `auto` passed over)


@dataclasses.dataclass(frozen=True)
class Health:
    """Every stream's source status and every GPU worker's use, for one metrics scrape."""

    sources: tuple[tuple[str, SourceStatus], ...]
    gpus: tuple[tuple[str, int, int | None], ...]  # (label, streams, allocator bytes)
    event_snapshots: tuple[tuple[str, EventSnapshotCounts], ...] = ()


class StreamService(Protocol):
    """What the API needs of the streams, wherever they run. Every method may block."""

    @property
    def class_names(self) -> tuple[str, ...]: ...

    @property
    def defaults(self) -> DetectionDefaults: ...

    def add(self, spec: StreamSpec) -> StreamView: ...

    def list(self) -> list[StreamView]: ...

    def get(self, stream_id: str) -> StreamView: ...

    def update_params(self, stream_id: str, **changes: Any) -> StreamView: ...

    def remove(self, stream_id: str) -> None: ...

    def __contains__(self, stream_id: object) -> bool: ...

    def __len__(self) -> int: ...

    def latest_jpeg(
        self,
        stream_id: str,
        *,
        boxes: bool = True,
        quality: int = 85,
        max_width: int | None = None,
        newest: bool = False,
        unless: Picture | None = None,
    ) -> EncodedFrame | None:
        """The latest frame as JPEG (vdet.streams.pictures.latest_jpeg says what the options do)."""
        ...

    def event_snapshot(self, stream_id: str, frame_index: int) -> EventSnapshot | None:
        """A kept JPEG of a frame with events (vdet.streams.event_snapshots); None when not kept."""
        ...

    def event_snapshots(
        self, stream_id: str
    ) -> tuple[builtins.list[EventSnapshotInfo], EventSnapshotCounts]:
        """The stream's event snapshots kept now, oldest first, and its counts."""
        ...

    def detect(
        self, image_bgr: ImageArray, params: PostprocessParams
    ) -> tuple[Detections, StageTimings]: ...

    def sync_metrics(self) -> None:
        """Bring every stream's counters in `Metrics` up to date (before a scrape)."""
        ...

    def describe(self) -> str: ...

    def close(self) -> None: ...


class LocalStreams:
    """Streams that run in this process: the detector, the GPU workers (GPU backends) and the
    stream manager, built from settings by `open`. Also what each stream worker process runs."""

    def __init__(self, detector: Detector, gpu: GpuPool | None, manager: StreamManager) -> None:
        self.detector = detector
        self.gpu = gpu
        self.manager = manager
        info, backend = detector.info, detector.backend
        self.backend_info = BackendInfo(
            backend=backend.name,
            device=str(backend.device),
            model=f"{info.path.name}@{info.sha256[:12]}",
            # Not every backend states its precision; those that do not run fp32.
            precision=str(getattr(backend, "precision", "fp32")),
            class_names=tuple(info.names),
            data_path="gpu" if backend.gpu_data_path else "cpu",
            selection=backend.selection,
        )

    @classmethod
    def open(
        cls,
        settings: Settings,
        hub: ResultSink,
        metrics: Metrics,
        *,
        detector_factory: DetectorFactory = default_detector_factory,
        max_streams: int | None = None,
    ) -> LocalStreams:
        detector = detector_factory(settings)
        # Tracking is on by default and its per-frame code is compiled (Numba): compiled or
        # loaded from its cache here, before any stream, not in the first tracked frame of one
        # (a cold compile takes seconds, which that stream would drop frames for).
        warm_up_tracking()
        gpu: GpuPool | None = None
        try:
            gpu = _gpu_pool(settings, detector.backend, metrics)
            manager = StreamManager(
                detector,
                detector.info.names,
                hub,
                metrics,
                max_streams=settings.max_streams if max_streams is None else max_streams,
                defaults=settings.detection,
                ingest=settings.ingest,
                gpu=gpu,
                parallel_frames=detector.parallel_frames,
                event_snapshots=settings.event_snapshots,
            )
        except BaseException:
            if gpu is not None:
                gpu.close()
            detector.close()
            raise
        return cls(detector, gpu, manager)

    # --- StreamService ----------------------------------------------------------------------

    @property
    def class_names(self) -> tuple[str, ...]:
        return self.manager.class_names

    @property
    def defaults(self) -> DetectionDefaults:
        return self.manager.defaults

    def add(self, spec: StreamSpec) -> StreamView:
        return self.manager.add(spec)

    def list(self) -> list[StreamView]:
        return self.manager.list()

    def get(self, stream_id: str) -> StreamView:
        return self.manager.get(stream_id)

    def update_params(self, stream_id: str, **changes: Any) -> StreamView:
        return self.manager.update_params(stream_id, **changes)

    def remove(self, stream_id: str) -> None:
        self.manager.remove(stream_id)

    def __contains__(self, stream_id: object) -> bool:
        return stream_id in self.manager

    def __len__(self) -> int:
        return len(self.manager)

    def latest_jpeg(
        self,
        stream_id: str,
        *,
        boxes: bool = True,
        quality: int = 85,
        max_width: int | None = None,
        newest: bool = False,
        unless: Picture | None = None,
    ) -> EncodedFrame | None:
        from vdet.streams.pictures import encode_latest

        return encode_latest(
            self.manager,
            stream_id,
            boxes=boxes,
            quality=quality,
            max_width=max_width,
            newest=newest,
            unless=unless,
        )

    def event_snapshot(self, stream_id: str, frame_index: int) -> EventSnapshot | None:
        return self.manager.event_snapshot(stream_id, frame_index)

    def event_snapshots(
        self, stream_id: str
    ) -> tuple[builtins.list[EventSnapshotInfo], EventSnapshotCounts]:
        return self.manager.event_snapshots(stream_id)

    def detect(
        self, image_bgr: ImageArray, params: PostprocessParams
    ) -> tuple[Detections, StageTimings]:
        ((detections, timings),) = self.detector.detect([image_bgr], params)
        return detections, timings

    def sync_metrics(self) -> None:
        self.manager.sync_metrics()

    def health(self) -> Health:
        """Source statuses and GPU use, for a process that keeps the metrics elsewhere."""
        sources = tuple((view.spec.id, view.status) for view in self.manager.list())
        snapshots = tuple((s, self.manager.event_snapshot_counts(s)) for s, _ in sources)
        if self.gpu is None:
            return Health(sources, (("cpu", len(sources), None),), snapshots)
        counts = self.gpu.streams_by_gpu()
        gpus = tuple((w.label, counts.get(w.label, 0), w.memory_bytes()) for w in self.gpu.workers)
        return Health(sources, gpus, snapshots)

    def describe(self) -> str:
        gpu = f"; GPU workers: {self.gpu.describe()}" if self.gpu is not None else ""
        return f"{self.backend_info.backend} on {self.backend_info.device}{gpu}"

    def close(self) -> None:
        try:
            self.manager.close()
        finally:
            try:
                if self.gpu is not None:
                    self.gpu.close()
            finally:
                self.detector.close()


def _gpu_pool(settings: Settings, backend: Any, metrics: Metrics) -> GpuPool | None:
    """GPU workers (NVDEC + CUDA graphs) when the backend feeds the GPU data path; else None.

    That is torch on CUDA, or a TensorRT (full or RTX) raw-head engine
    (`InferenceBackend.gpu_data_path`). ONNX Runtime (CPU), end-to-end engines and an engine
    still being built behind another backend (the handoff backend) decode on the CPU and run
    every frame through the `Detector`.
    """
    if not backend.gpu_data_path:
        return None
    from vdet.gpu.devices import build_gpu_pool
    from vdet.gpu.gil import tune_interpreter_for_streams

    tune_interpreter_for_streams()
    return build_gpu_pool(
        settings.gpu,
        backend,
        on_eager_fallback=metrics.inference_eager_fallbacks.inc,
        input_shape=settings.input_shape,
    )


class Runtime:
    """The running service: settings, metrics, hub, and (once started) its streams."""

    def __init__(
        self, settings: Settings, detector_factory: DetectorFactory = default_detector_factory
    ) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.hub = ResultsHub(
            capacity_per_source=settings.hub.capacity_per_source,
            capacity_total=settings.hub.capacity_total,
            subscriber_queue_size=settings.hub.subscriber_queue_size,
        )
        self.detector_factory = detector_factory
        self.streams: StreamService | None = None
        self.backend: BackendInfo | None = None
        self.sources_started = 0
        self.sources_restored = 0  # streams the streams file added to the configured ones
        self.ready = False

    @property
    def class_names(self) -> tuple[str, ...]:
        return self.backend.class_names if self.backend is not None else ()

    @property
    def worker_pool(self) -> WorkerPool | None:
        """The worker processes running the streams; None when they run in this process."""
        from vdet.workers.pool import WorkerPool

        streams = self.streams
        if isinstance(streams, PersistentStreams):
            streams = streams.inner
        return streams if isinstance(streams, WorkerPool) else None

    @property
    def worker_processes(self) -> int:
        pool = self.worker_pool
        return 0 if pool is None else sum(w.alive for w in pool.workers() if w.role == "worker")

    @property
    def mps_active(self) -> bool:
        pool = self.worker_pool
        return pool is not None and pool.mps_active

    def event_jpeg(self, stream_id: str, frame_index: int) -> bytes | None:
        """The event snapshot of a stream's frame as JPEG; None when it is not kept, or the
        stream or the service is gone. Blocks (it may wait for the encoding, or a worker)."""
        streams = self.streams
        if streams is None:
            return None
        try:
            snapshot = streams.event_snapshot(stream_id, frame_index)
        except StreamError:  # removed meanwhile, or its worker process is restarting
            return None
        return None if snapshot is None else snapshot.jpeg

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Build the streams' home and add the configured sources. On failure everything
        started so far is stopped again and the error names what failed. `loop`: the API's
        event loop, running while this runs (off it), where worker processes' results are
        read (vdet.workers.inbox)."""
        self.sources_started = self.sources_restored = 0
        try:
            self.streams, self.backend = self._open_streams(loop)
            self.metrics.set_class_names(self.backend.class_names)
            self.metrics.set_backend(
                backend=self.backend.backend,
                device=self.backend.device,
                model=self.backend.model,
                precision=self.backend.precision,
                data_path=self.backend.data_path,
                selection=self.backend.selection,
            )
            self._start_sources()
        except BaseException:
            self.stop()
            raise
        self.ready = True
        log.info(
            "vdet ready: model %s, %s, %d source(s)",
            self.settings.model_path,
            self.streams.describe(),
            len(self.streams),
        )

    def _start_sources(self) -> None:
        """Start the configured sources and, with `streams_file`, the streams kept there
        (vdet.streams.store: which apply, in what order); then the streams file records every
        change made through the API."""
        assert self.streams is not None
        configured = self.settings.sources
        path = self.settings.streams_file
        store = None if path is None else StreamStore(path)
        if store is None:
            plan = StartupPlan([StartupStream(s, s, from_file=False) for s in configured], [])
            self._start_planned(plan, configured)
            return
        store.check_writable()
        store.lock()  # before reading: what it reads is then what no other service will change
        try:
            plan = plan_startup(configured, store.load())
            for note in plan.notes:
                log.info("streams file %s: %s", path, note)
            self._start_planned(plan, configured)
            self.streams = PersistentStreams(
                self.streams,
                store,
                configured,
                plan.removed,
                on_save_failure=self.metrics.streams_file_write_failures.inc,
            )
        except BaseException:
            store.unlock()  # the start failed: no PersistentStreams, which unlocks at close
            raise
        self.streams.save()  # what runs now, without what no longer applies

    def _start_planned(self, plan: StartupPlan, configured: Sequence[StreamSpec]) -> None:
        configured_ids = {spec.id for spec in configured}
        for item in plan.streams:
            if not self._start_source(item):
                continue
            if item.spec.id in configured_ids:
                self.sources_started += 1
            else:
                self.sources_restored += 1

    def _start_source(self, item: StartupStream) -> bool:
        """Start one stream; a spec from the streams file that no longer starts (a changed
        source policy, a model without its classes) gives way to the config file's entry, or,
        for a stream the API had added, is left out with an error in the log (False)."""
        assert self.streams is not None
        try:
            self.streams.add(item.spec)
            return True
        except Exception as exc:
            if not item.from_file:
                raise RuntimeError(f"configured source {item.spec.id!r}: {exc}") from exc
            log.error(
                "stream %r from the streams file does not start (%s); %s",
                item.spec.id,
                redact(str(exc)),
                "the config file's entry is started instead"
                if item.configured is not None
                else "left out",
            )
        if item.configured is None:
            return False
        return self._start_source(StartupStream(item.configured, None, from_file=False))

    def _open_streams(
        self, loop: asyncio.AbstractEventLoop | None
    ) -> tuple[StreamService, BackendInfo]:
        from vdet.workers.plan import plan_workers

        plan = plan_workers(self.settings)
        if plan.processes == 0:
            local = LocalStreams.open(
                self.settings, self.hub, self.metrics, detector_factory=self.detector_factory
            )
            return local, local.backend_info
        from vdet.workers.pool import WorkerPool

        pool = WorkerPool.start(self.settings, plan, self.hub, self.metrics, loop)
        return pool, pool.backend_info

    def stop(self) -> None:
        """End WebSocket feeds, then stop every stream and what runs them. Idempotent."""
        self.ready = False
        self.hub.close()  # WebSocket feeds say goodbye first
        streams, self.streams = self.streams, None
        if streams is not None:
            streams.close()
