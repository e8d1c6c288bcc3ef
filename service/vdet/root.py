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
from vdet.config.streams import StreamSpec
from vdet.core.redact import use_secret_params
from vdet.cuda.launch import use_cache_dir
from vdet.inference.factory import DetectorFactory, open_configured_detector, open_worker_detector
from vdet.ingest.urls import SourcePolicy, validate_source_url
from vdet.metrics.registry import Metrics
from vdet.notify.notifier import Notifier
from vdet.results.hub import ResultsHub
from vdet.results.wire import encode_result_tail
from vdet.streams.local import LocalStreams
from vdet.streams.manager import ResultSink, StreamManager
from vdet.streams.params import resolve_classes, stream_class_thresholds, stream_params
from vdet.streams.service import (
    BackendInfo,
    StreamControl,
    StreamError,
    StreamService,
    StreamView,
    view_of_spec,
)
from vdet.streams.startup import Started, start_streams
from vdet.tracking.compiled import warm_up as warm_up_tracking
from vdet.tracking.zones import resolve_zones
from vdet.workers.plan import plan_workers, stream_capacity
from vdet.workers.pool import WorkerPool

if TYPE_CHECKING:
    from vdet.fleet.member import FleetMember  # loaded only where a fleet is configured
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
    numbered_by: ResultsHub | None = None,
) -> LocalStreams:
    """Streams that run in this process: the detector, the GPU devices where the backend feeds
    the GPU data path, and the stream manager, whose results go to `sink`; `numbered_by`: the
    hub whose numbers a picture's result gets, when it numbers results after `publish` (a
    fleet node's)."""
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
    seq_of = None
    if numbered_by is not None:
        hub = numbered_by

        def seq_of(stream_id: str, frame_index: int) -> int | None:
            found = hub.find(stream_id, frame_index, wait_s=0.1)
            return None if found is None else found.seq

    return LocalStreams(detector, gpu, manager, seq_of)


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
        self.fleet: FleetMember | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.ready = False

    @property
    def class_names(self) -> tuple[str, ...]:
        return self.backend.class_names if self.backend is not None else ()

    @property
    def worker_pool(self) -> WorkerPool | None:
        """The worker processes running the streams; None when they run in this process."""
        return self.streams if isinstance(self.streams, WorkerPool) else None

    def has_stream(self, stream_id: str) -> bool:
        """Whether `stream_id` is a stream of this server, or in a fleet, of the fleet (its
        results reach this node's hub wherever it runs). Call it on the event loop."""
        if self.fleet is not None:
            return stream_id in self.fleet.node.view.desired
        return self.streams is not None and stream_id in self.streams

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
                    settings,
                    self.hub,
                    self.metrics,
                    detector_factory=self.detector_factory,
                    numbered_by=self.hub if settings.cluster.servers else None,
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
            if settings.cluster.enabled:
                self.control = self._join_fleet(loop, stream_capacity(settings, plan))
            else:
                self.started = start_streams(
                    self.streams,
                    settings.sources,
                    settings.streams_file,
                    on_save_failure=self.metrics.streams_file_write_failures.inc,
                )
                self.control = self.started.control
            fleet = self.fleet
            self.notifier = Notifier(
                settings.notify,
                self.hub,
                self.metrics,
                backend.class_names,
                snapshot_of=self.event_jpeg if settings.event_snapshots.per_stream else None,
                clips=ClipStore.of(settings.clips),
                # In a fleet every node's hub has every result: events go out once per
                # fleet, from a consumer the nodes share (vdet.fleet.notifications).
                follow=fleet.follow_notifications if fleet is not None else None,
            )
        except BaseException:
            self.stop()
            raise
        self.ready = True
        kept = f"; streams kept in {settings.streams_file}" if settings.streams_file else ""
        if self.fleet is not None:
            kept = f"; fleet node {self.fleet.node.node_id}"
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
        self._leave_fleet()  # its streams handed to other nodes while they still run here
        self.hub.close()  # WebSocket feeds say goodbye first
        streams, self.streams, self.control = self.streams, None, None
        started, self.started = self.started, None
        try:
            if streams is not None:
                streams.close()
        finally:
            if started is not None:
                started.close()

    # -- a fleet node ----------------------------------------------------------------------

    def _join_fleet(self, loop: asyncio.AbstractEventLoop | None, capacity: int) -> StreamControl:
        """Join the fleet (settings `cluster`) on `loop`; the API's writes then go to the
        fleet's desired state."""
        from vdet.fleet.control import FleetControl, pending_status
        from vdet.fleet.member import FleetMember

        settings, streams = self.settings, self.streams
        assert streams is not None
        if loop is None:
            raise RuntimeError("a fleet node runs on the API's event loop: start it from there")
        names = streams.backend_info.class_names
        policy = SourcePolicy.of(settings.ingest.source_policy)

        def check(spec: StreamSpec) -> None:
            validate_source_url(spec.url, policy)
            stream_class_thresholds(spec, stream_params(spec, settings.detection, names), names)
            resolve_zones(spec.zones, lambda refs: resolve_classes(refs, names))

        def pending(spec: StreamSpec) -> StreamView:
            return view_of_spec(spec, settings.detection, names, pending_status())

        for spec in settings.sources:
            check(spec)  # a configured source this node could not run stops the start here
        cluster = settings.cluster
        if cluster.capacity is not None:
            capacity = cluster.capacity
        joining = FleetMember.join(
            cluster,
            capacity,
            streams,
            self.hub,
            lambda result: encode_result_tail(result, names),
            settings.sources,
            replay=settings.hub.capacity_total,
            notifies=bool(settings.notify.webhooks) or settings.notify.mqtt is not None,
            on_event=lambda kind, _stream, _detail: self.metrics.count_lease_event(kind),
            on_ack=self.metrics.fleet_bus_ack.observe,
        )
        # Connecting and opening the buckets each wait up to four connect timeouts.
        timeout = 10 * cluster.connect_timeout_s
        future = asyncio.run_coroutine_threadsafe(joining, loop)
        try:
            self.fleet = future.result(timeout)
        except TimeoutError:
            future.cancel()
            raise ConnectionError(
                f"joining the fleet at {', '.join(cluster.servers)} took over {timeout:g} s"
            ) from None
        self._loop = loop
        return FleetControl(self.fleet.store, loop, streams, check, pending)

    def _leave_fleet(self) -> None:
        fleet, self.fleet = self.fleet, None
        loop = self._loop
        if fleet is None or loop is None or loop.is_closed():
            return
        try:
            asyncio.run_coroutine_threadsafe(fleet.leave(), loop).result(30)
        except Exception:
            log.exception("fleet: leaving the fleet failed; the leases expire on their own")
        finally:
            self.hub.send_to(None)
