"""The composition root: the one place that turns `Settings` into the running system.

`build(settings)` makes the `Service` with what lives as long as the process: the settings, the
metrics registry, the results hub. `Service.start` builds the rest in order: where the streams
run (here, `open_local_streams`; or in stream worker processes, each of which builds its own
with the same function through `open_worker_streams`), then the configured sources and the
streams file (vdet.streams.startup), then the notifications (vdet.notify); `stop` takes it down
in reverse. The API, the CLI and the benchmarks assemble vdet only through this module, and
nothing below it imports it (tests/test_layout.py).

It speaks no HTTP. Starting and stopping block (model loading, process starts): call them from a
thread, never from the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from vdet.clips.store import ClipStore
from vdet.config.settings import Settings
from vdet.core.redact import use_secret_params
from vdet.cuda.launch import use_cache_dir
from vdet.inference.factory import DetectorFactory, open_configured_detector, open_worker_detector
from vdet.metrics.registry import Metrics
from vdet.notify.notifier import Notifier
from vdet.results.hub import ResultsHub
from vdet.streams.local import LocalStreams
from vdet.streams.manager import ResultSink, StreamManager
from vdet.streams.service import BackendInfo, StreamControl, StreamError, StreamService
from vdet.streams.startup import Started, start_streams
from vdet.tracking.compiled import warm_up as warm_up_tracking
from vdet.workers.plan import plan_workers
from vdet.workers.pool import WorkerPool

if TYPE_CHECKING:
    from vdet.gpu.devices import GpuPool  # imports torch: only where a GPU backend runs

log = logging.getLogger(__name__)


def build(
    settings: Settings, *, detector_factory: DetectorFactory = open_configured_detector
) -> Service:
    """The service for `settings`, not started."""
    use_secret_params(settings.secret_query_params)  # before any URL is shown
    hub = ResultsHub(
        capacity_per_source=settings.hub.capacity_per_source,
        capacity_total=settings.hub.capacity_total,
        subscriber_queue_size=settings.hub.subscriber_queue_size,
    )
    return Service(settings, Metrics(), hub, detector_factory)


def open_local_streams(
    settings: Settings,
    sink: ResultSink,
    metrics: Metrics,
    *,
    detector_factory: DetectorFactory = open_configured_detector,
    max_streams: int | None = None,
) -> LocalStreams:
    """Streams that run in this process: the detector, the GPU devices where the backend feeds
    the GPU data path, and the stream manager, whose results go to `sink`."""
    use_cache_dir(settings.gpu.kernel_cache_dir)  # before a GPU backend compiles any kernel
    detector = detector_factory(settings)
    # Tracking is on by default and its per-frame code is compiled (Numba): compiled or loaded
    # from its cache here, before any stream, not in the first tracked frame of one (a cold
    # compile takes seconds, which that stream would drop frames for).
    warm_up_tracking()
    gpu: GpuPool | None = None
    try:
        gpu = _gpu_pool(settings, detector.backend, metrics)
        manager = StreamManager(
            detector,
            detector.info.names,
            sink,
            metrics,
            max_streams=settings.max_streams if max_streams is None else max_streams,
            defaults=settings.detection,
            ingest=settings.ingest,
            gpu=gpu,
            parallel_frames=detector.parallel_frames,
            event_snapshots=settings.event_snapshots,
            clips=settings.clips,
        )
    except BaseException:
        if gpu is not None:
            gpu.close()
        detector.close()
        raise
    return LocalStreams(detector, gpu, manager)


def open_worker_streams(
    settings: Settings,
    sink: ResultSink,
    metrics: Metrics,
    max_streams: int,
    cpu_threads: int | None,
) -> LocalStreams:
    """A stream worker process's streams (vdet.workers.child.Assemble): as in one process, with
    the worker's share of the streams and, on the CPU, of the cores."""
    return open_local_streams(
        settings,
        sink,
        metrics,
        detector_factory=lambda s: open_worker_detector(s, cpu_threads),
        max_streams=max_streams,
    )


def _gpu_pool(settings: Settings, backend: Any, metrics: Metrics) -> GpuPool | None:
    """GPU devices (NVDEC + CUDA graphs) when the backend feeds the GPU data path: torch on
    CUDA, or a TensorRT (full or RTX) raw-head engine (`InferenceBackend.gpu_data_path`). ONNX
    Runtime (CPU), end-to-end engines and an engine still being built behind another backend
    decode on the CPU and run every frame through the `Detector`: None."""
    if not backend.gpu_data_path:
        return None
    from vdet.gpu.devices import build_gpu_pool
    from vdet.gpu.gil import shorten_gil_switch_interval

    shorten_gil_switch_interval()
    return build_gpu_pool(
        settings.gpu,
        backend,
        on_eager_fallback=metrics.inference_eager_fallbacks.inc,
        input_shape=settings.input_shape,
    )


class Service:
    """The running service: settings, metrics, hub, and once started its streams, where
    changes to them go (`control`: the streams, or the streams file around them) and the
    notifications."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        hub: ResultsHub,
        detector_factory: DetectorFactory = open_configured_detector,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.hub = hub
        self.detector_factory = detector_factory
        self.streams: StreamService | None = None
        self.control: StreamControl | None = None
        self.notifier: Notifier | None = None
        self.backend: BackendInfo | None = None
        self.started: Started | None = None
        self.ready = False

    @property
    def class_names(self) -> tuple[str, ...]:
        return self.backend.class_names if self.backend is not None else ()

    @property
    def worker_pool(self) -> WorkerPool | None:
        """The worker processes running the streams; None when they run in this process."""
        return self.streams if isinstance(self.streams, WorkerPool) else None

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
        """Open the streams' home, start the configured sources, make the notifier (started on
        the event loop by its owner). On failure everything started so far is stopped again
        and the error names what failed. `loop`: the API's event loop, running while this runs
        (off it), where worker processes' results are read (vdet.workers.inbox)."""
        settings = self.settings
        try:
            plan = plan_workers(settings)
            if plan.processes == 0:
                self.streams = open_local_streams(
                    settings, self.hub, self.metrics, detector_factory=self.detector_factory
                )
            else:
                self.streams = WorkerPool.start(
                    settings, plan, self.hub, self.metrics, open_worker_streams, loop
                )
            self.backend = backend = self.streams.backend_info
            self.metrics.set_class_names(backend.class_names)
            self.metrics.set_backend(
                backend=backend.backend,
                device=backend.device,
                model=backend.model,
                precision=backend.precision,
                data_path=backend.data_path,
                selection=backend.selection,
            )
            self.started = start_streams(
                self.streams,
                settings.sources,
                settings.streams_file,
                on_save_failure=self.metrics.streams_file_write_failures.inc,
            )
            self.control = self.started.control
            self.notifier = Notifier(
                settings.notify,
                self.hub,
                self.metrics,
                backend.class_names,
                snapshot_of=self.event_jpeg if settings.event_snapshots.per_stream else None,
                clips=ClipStore.of(settings.clips),
            )
        except BaseException:
            self.stop()
            raise
        self.ready = True
        kept = f"; streams kept in {settings.streams_file}" if settings.streams_file else ""
        log.info(
            "vdet ready: model %s, %s%s, %d source(s)",
            settings.model_path,
            self.streams.describe(),
            kept,
            len(self.streams.list()),
        )

    def stop(self) -> None:
        """End WebSocket feeds, then stop every stream and what runs them, then let the
        streams file go. Idempotent. (The notifier is stopped by its owner, on its loop.)"""
        self.ready = False
        self.hub.close()  # WebSocket feeds say goodbye first
        streams, self.streams, self.control = self.streams, None, None
        started, self.started = self.started, None
        try:
            if streams is not None:
                streams.close()
        finally:
            if started is not None:
                started.close()
