"""The FastAPI application factory and its lifespan.

`create_app(settings)` wires one independent instance: its own metrics registry, results hub,
and (in the lifespan, off the event loop) the detector, the stream manager and the configured
sources. Shutdown ends WebSocket feeds, stops every stream, then closes the detector.
This module assembles; the routes live in `routes_*.py`, the wire format in `schemas.py`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from vdet.api import routes_detect, routes_events, routes_ops, routes_streams, routes_zones
from vdet.api.auth import require_api_key
from vdet.api.deps import Runtime
from vdet.api.schemas import ErrorOut
from vdet.config import Settings
from vdet.hub import ResultsHub
from vdet.metrics import Metrics
from vdet.pipeline.detector import Detector
from vdet.pipeline.postprocess import PostprocessParams
from vdet.streams import DuplicateStreamError, LimitError, StreamManager, UnknownStreamError

if TYPE_CHECKING:  # imports torch: only where a GPU backend runs
    from vdet.gpu_workers import GpuPool

log = logging.getLogger(__name__)

DetectorFactory = Callable[[Settings], Detector]

_DESCRIPTION = """
Real-time object detection on video streams (RTSP, HTTP, files) and single images.

* **Streams** (`/v1/streams`): add a source, read its latest detections or an annotated
  snapshot, change its thresholds, delete it.
* **Events** (WebSocket, not listed below): `/v1/streams/{id}/events?after=<seq>` and
  `/v1/events?after=<seq>` push `{"type": "result", "result": ...}` messages; pass the last
  `seq` you saw as `after` when reconnecting to continue without gaps or duplicates. A
  `{"type": "gap", ...}` message says the requested seq has left the replay buffer.
* **Tracking and zones**: each stream detection has a `track_id` (ByteTrack, per stream);
  `/v1/streams/{id}/zones` holds polygon zones and counting lines, and each result's `events`
  lists the `zone_enter`, `zone_exit` (with `dwell_s`) and `line_cross` (with `direction`)
  its frame caused, under the result's `seq`.
* **Detect** (`/v1/detect`): one image in, detections out.
* **Auth**: when the server has an API key, send `X-API-Key` or `Authorization: Bearer`;
  WebSockets may use `?api_key=` or the subprotocol `vdet.api-key.<key>` (with `vdet.v1`).
  `/healthz`, `/readyz` and `/metrics` are always open.
* **Errors**: JSON `{"detail": ...}`. Stream limit reached and duplicate id are both **409**.
"""


def default_detector_factory(settings: Settings) -> Detector:
    """The detector for `settings`: its model on its backend, with its default thresholds."""
    d = settings.detection
    params = PostprocessParams(
        conf_threshold=d.conf_threshold,
        iou_threshold=d.iou_threshold,
        top_k=d.top_k,
        max_det=d.max_det,
    )
    return Detector.open(settings.model_path, settings.backend, params=params)


def create_app(
    settings: Settings | None = None,
    detector_factory: DetectorFactory = default_detector_factory,
) -> FastAPI:
    """A ready-to-serve app for `settings` (default: `Settings()` from env / $VDET_CONFIG)."""
    settings = settings if settings is not None else Settings()
    metrics = Metrics()
    hub = ResultsHub(
        capacity_per_source=settings.hub.capacity_per_source,
        capacity_total=settings.hub.capacity_total,
        subscriber_queue_size=settings.hub.subscriber_queue_size,
    )
    runtime = Runtime(settings=settings, metrics=metrics, hub=hub)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await _start(runtime, detector_factory)
        try:
            yield
        finally:
            await _stop(runtime)

    app = FastAPI(
        title="vdet",
        version="0.1.0",
        summary="Real-time video object detection",
        description=_DESCRIPTION,
        lifespan=lifespan,
        openapi_tags=[
            {
                "name": "streams",
                "description": "Video sources, their latest results, zones and lines.",
            },
            {"name": "detect", "description": "Detection on uploaded images."},
            {"name": "ops", "description": "Health, readiness and metrics (no API key)."},
        ],
    )
    app.state.runtime = runtime
    protected: list[Any] = [Depends(require_api_key)] if settings.api_key is not None else []
    errors: dict[int | str, dict[str, Any]] = {
        503: {"model": ErrorOut, "description": "The service is starting or stopping."}
    }
    if protected:
        errors[401] = {"model": ErrorOut, "description": "Missing or invalid API key."}
    app.include_router(routes_streams.router, dependencies=protected, responses=errors)
    app.include_router(routes_zones.router, dependencies=protected, responses=errors)
    app.include_router(routes_detect.router, dependencies=protected, responses=errors)
    app.include_router(routes_events.router)  # WebSockets check the key in the handshake
    app.include_router(routes_ops.router)
    _add_exception_handlers(app)
    return app


async def _start(rt: Runtime, detector_factory: DetectorFactory) -> None:
    settings = rt.settings
    rt.sources_started = 0
    rt.detector = detector = await run_in_threadpool(detector_factory, settings)
    try:
        info, backend = detector.info, detector.backend
        rt.class_names = info.names
        rt.metrics.set_class_names(info.names)
        rt.metrics.set_backend(
            backend=backend.name,
            device=backend.device,
            model=f"{info.path.name}@{info.sha256[:12]}",
            # Not every backend states its precision yet; ONNX Runtime on CPU runs fp32.
            precision=str(getattr(backend, "precision", "fp32")),
        )
        rt.gpu = await run_in_threadpool(_gpu_pool, settings, backend, rt.metrics)
        rt.manager = manager = StreamManager(
            detector,
            info.names,
            rt.hub,
            rt.metrics,
            max_streams=settings.max_streams,
            defaults=settings.detection,
            ingest=settings.ingest,
            gpu=rt.gpu,
        )
        for spec in settings.sources:
            try:
                await run_in_threadpool(manager.add, spec)
            except Exception as exc:
                raise RuntimeError(f"configured source {spec.id!r}: {exc}") from exc
            rt.sources_started += 1
    except BaseException:
        await _stop(rt)
        raise
    rt.ready = True
    gpu = f"; GPU workers: {rt.gpu.describe()}" if rt.gpu is not None else ""
    log.info(
        "vdet ready: model %s on %s, %d source(s)%s", info.path, backend.device, len(manager), gpu
    )


def _gpu_pool(settings: Settings, backend: Any, metrics: Metrics) -> GpuPool | None:
    """GPU workers (NVDEC + CUDA graphs) when the backend runs on a GPU; else None.

    That is torch on CUDA, or a TensorRT raw-head engine. ONNX Runtime (CPU), end-to-end
    engines and a TensorRT engine still being built behind ONNX Runtime (the handoff backend)
    decode on the CPU and run every frame through the `Detector`.
    """
    kind = type(backend).__name__
    if kind == "TorchBackend":
        if not str(backend.device).startswith("cuda"):
            return None
    elif kind != "TensorRTBackend" or backend.end_to_end:
        return None
    from vdet.gpu_workers import build_gpu_pool, tune_interpreter_for_streams

    tune_interpreter_for_streams()
    return build_gpu_pool(
        settings.gpu, backend, on_eager_fallback=metrics.inference_eager_fallbacks.inc
    )


async def _stop(rt: Runtime) -> None:
    rt.ready = False
    rt.hub.close()  # WebSocket feeds say goodbye first
    manager, detector, gpu = rt.manager, rt.detector, rt.gpu
    rt.manager = rt.detector = rt.gpu = None
    if manager is not None:
        await run_in_threadpool(manager.close)
    if gpu is not None:
        await run_in_threadpool(gpu.close)
    if detector is not None:
        await run_in_threadpool(detector.close)


def _add_exception_handlers(app: FastAPI) -> None:
    async def not_found(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=404)

    async def conflict(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=409)

    app.add_exception_handler(UnknownStreamError, not_found)
    app.add_exception_handler(DuplicateStreamError, conflict)
    app.add_exception_handler(LimitError, conflict)
