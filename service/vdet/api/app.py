"""The FastAPI application factory and its lifespan.

`create_app(settings)` wires one independent instance around its own `Service`, built by the
composition root (vdet.root: metrics registry, results hub, and, started by the lifespan off the
event loop, the streams wherever they run and the notifications). Shutdown ends WebSocket feeds,
then stops every stream. This module only wires the web layer; the routes live in
`routes_*.py`, their bodies in `schemas.py`, a result's JSON in vdet.results.wire.
"""

from __future__ import annotations

import asyncio
import functools
import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from starlette.concurrency import run_in_threadpool

from vdet.api import (
    docs_pages,
    fleet_clips,
    fleet_reads,
    limits,
    loop_health,
    methods,
    responses,
    routes_clips,
    routes_detect,
    routes_events,
    routes_history,
    routes_live,
    routes_nodes,
    routes_ops,
    routes_snapshots,
    routes_streams,
    routes_ui,
    routes_webhooks,
    routes_workers,
    routes_zones,
)
from vdet.api.auth import require_api_key
from vdet.api.images import DecodeBudget
from vdet.api.live import LiveVideo
from vdet.api.responses import SafeJSONResponse
from vdet.api.schemas import ErrorOut
from vdet.api.ws_seats import Seats
from vdet.config.settings import Settings
from vdet.inference.factory import DetectorFactory, open_configured_detector
from vdet.results.history import EventHistory
from vdet.results.wire import ResultEventEncoder
from vdet.root import Service, build
from vdet.streams.service import (
    DuplicateStreamError,
    LimitError,
    StreamUnavailableError,
    UnknownStreamError,
)

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


def create_app(
    settings: Settings | None = None,
    detector_factory: DetectorFactory = open_configured_detector,
    *,
    freeze_startup_objects: bool = False,
) -> FastAPI:
    """A ready-to-serve app for `settings` (default: `Settings()` from env / $VDET_CONFIG).

    `freeze_startup_objects` (for the process `vdet serve` runs, not for apps in tests, which
    would keep every earlier test's objects): once started, everything alive so far goes to
    the garbage collector's permanent generation (`gc.freeze`), so that a full collection walks
    only what serving allocates. Modules, routes and models are about a hundred thousand
    tracked objects, and a full collection over them stops every thread of the process for
    a tenth of a second on a small machine.
    """
    settings = settings if settings is not None else Settings()
    service = build(settings, detector_factory=detector_factory)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Model loading and process starts block: off the event loop, which reads the worker
        # processes' results meanwhile and from then on.
        await run_in_threadpool(service.start, asyncio.get_running_loop())
        notifier = service.notifier
        history = EventHistory(settings.hub.event_history, service.class_names)
        service.hub.add_observer(history.add)
        app.state.event_history = history
        try:
            if service.fleet is not None:  # other nodes read this node's streams
                await service.fleet.serve_reads(functools.partial(_answer_read, service))
            if notifier is not None:
                notifier.start()
            if freeze_startup_objects:
                gc.collect()  # garbage is freed first, not frozen
                gc.freeze()
            async with loop_health.measured(service.metrics):
                yield
        finally:
            # Streams first: the webhooks see every result until the hub closes, then get
            # `notify.shutdown_grace_s` to send what waits.
            await run_in_threadpool(service.stop)
            if notifier is not None:
                await notifier.stop()

    app = FastAPI(
        title="vdet",
        version="0.1.0",
        summary="Real-time video object detection",
        description=_DESCRIPTION,
        lifespan=lifespan,
        default_response_class=SafeJSONResponse,
        docs_url=None,  # vdet.api.docs_pages serves them with their assets (no CDN)
        redoc_url=None,
        openapi_tags=[
            {
                "name": "streams",
                "description": "Video sources, their latest results, zones and lines.",
            },
            {"name": "detect", "description": "Detection on uploaded images."},
            {"name": "ops", "description": "Health, readiness and metrics (no API key)."},
        ],
    )
    app.state.service = service
    app.state.encoder = encoder = ResultEventEncoder()
    # Results are encoded once, by the thread that publishes them, not on the event loop.
    service.hub.on_publish(lambda result: encoder.encode(result, service.class_names))
    protected: list[Any] = [Depends(require_api_key)] if settings.api_key is not None else []
    errors: dict[int | str, dict[str, Any]] = {
        503: {"model": ErrorOut, "description": "The service is starting or stopping."}
    }
    if protected:
        errors[401] = {"model": ErrorOut, "description": "Missing or invalid API key."}
    app.state.live_video = LiveVideo(settings.live, service.metrics)
    app.state.decode_budget = DecodeBudget(settings.limits.decode_budget_pixels)
    app.state.websocket_seats = Seats(
        settings.limits.max_websocket_clients, settings.limits.max_websocket_clients_per_stream
    )
    routers: tuple[APIRouter, ...] = (
        routes_streams.router,
        routes_live.router,
        routes_zones.router,
        routes_zones.counts_router,
        routes_detect.router,
        routes_workers.router,
        routes_nodes.router,
        routes_webhooks.router,
        routes_snapshots.router,
        routes_history.router,
        routes_clips.router,
    )
    for router in routers:
        app.include_router(router, dependencies=protected, responses=errors)
    app.include_router(routes_events.router)  # WebSockets check the key in the handshake
    app.include_router(routes_ops.router)
    app.include_router(routes_ui.router)  # the web page: public files; data needs the key
    routers += (routes_events.router, routes_ops.router, routes_ui.router)
    docs_pages.install(app)
    _add_exception_handlers(app)
    responses.install(app)
    limits.install(app, settings)  # body limits, read timeouts, key before body
    # Outside the key check: which methods a URL takes is no secret (/openapi.json says it).
    # The routers' own routes: what the app holds of an included router is FastAPI's business.
    routes = [route for router in routers for route in router.routes] + app.router.routes
    app.add_middleware(methods.AllowedMethods, routes=routes)
    return app


async def _answer_read(
    service: Service, op: str, args: dict[str, Any]
) -> tuple[dict[str, Any], bytes]:
    """This node's answer to another node's read: of its clips folder, or of a stream it runs."""
    if op in fleet_clips.OPS:
        return await fleet_clips.answer(service, op, args)
    return await fleet_reads.answer(service, op, args)


def _add_exception_handlers(app: FastAPI) -> None:
    async def not_found(request: Request, exc: Exception) -> SafeJSONResponse:
        return SafeJSONResponse({"detail": str(exc)}, status_code=404)

    async def conflict(request: Request, exc: Exception) -> SafeJSONResponse:
        return SafeJSONResponse({"detail": str(exc)}, status_code=409)

    async def unavailable(request: Request, exc: Exception) -> SafeJSONResponse:
        return SafeJSONResponse({"detail": str(exc)}, status_code=503, headers={"Retry-After": "1"})

    app.add_exception_handler(UnknownStreamError, not_found)
    app.add_exception_handler(DuplicateStreamError, conflict)
    app.add_exception_handler(LimitError, conflict)
    app.add_exception_handler(StreamUnavailableError, unavailable)
