"""Operational endpoints: liveness, readiness and Prometheus metrics (never behind the API key)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Response, status
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from vdet.api.deps import ServiceDep
from vdet.api.schemas import HealthOut, ReadyOut
from vdet.metrics.registry import CONTENT_TYPE

router = APIRouter(tags=["ops"])

# How long a scrape's rendering runs on the event loop before letting other work in.
_RENDER_SLICE_S = 0.002


@router.get("/healthz", response_model=HealthOut, summary="Liveness: the process is serving")
async def healthz() -> HealthOut:
    return HealthOut()


@router.get(
    "/readyz",
    response_model=ReadyOut,
    summary="Readiness: the detector is loaded and every configured source has started",
    responses={503: {"model": ReadyOut, "description": "Starting or stopping."}},
)
async def readyz(service: ServiceDep) -> ReadyOut | JSONResponse:
    # Started means the source's worker runs, not that its camera is up: a camera outage is
    # visible per stream and in metrics, and must not take the whole service out of rotation.
    configured = len(service.settings.sources)
    backend, pool, started = service.backend, service.worker_pool, service.started
    body = ReadyOut(
        ready=service.ready,
        detector_loaded=backend is not None,
        worker_processes=0 if pool is None else pool.processes_alive(),
        mps=pool is not None and pool.mps_active,
        sources_configured=configured,
        sources_started=started.configured if started is not None else 0,
        sources_restored=started.restored if started is not None else 0,
        detail=None if service.ready else "starting or stopping",
        backend=backend.backend if backend is not None else None,
        data_path=backend.data_path if backend is not None else None,
        backend_selection=backend.selection if backend is not None else None,
    )
    streams = service.streams
    if service.ready and streams is not None:
        # Asks the worker processes (blocking, little Python): on a thread.
        for view in await run_in_threadpool(streams.list):
            if view.status.decode_path == "cpu" and view.status.decode_reason is not None:
                label = view.status.decode_reason_label
                body.streams_decoded_on_cpu[label] = body.streams_decoded_on_cpu.get(label, 0) + 1
    if service.ready:
        return body
    return JSONResponse(body.model_dump(), status_code=status.HTTP_503_SERVICE_UNAVAILABLE)


@router.get(
    "/metrics",
    response_class=Response,
    summary="Prometheus metrics",
    responses={
        200: {
            "content": {CONTENT_TYPE: {"schema": {"type": "string"}}},
            "description": "Prometheus text exposition format.",
        }
    },
)
async def metrics(service: ServiceDep) -> Response:
    streams = service.streams
    if streams is not None:
        # Waits for the worker processes' counts (blocking, little Python): on a thread.
        await run_in_threadpool(streams.sync_metrics)
    if (fleet := service.fleet) is not None:  # read on the loop, where the fleet's view lives
        info = fleet.info()
        service.metrics.sync_fleet(
            nodes=len(info.nodes),
            leases=len(fleet.node.held),
            unowned=len(info.unowned),
            results=fleet.totals(),
            lag=fleet.feed.lag,
            notify_pending=fleet.notify_pending,
        )
    # Rendered on the loop a slice at a time, not on a thread (see Metrics.render_pieces).
    loop = asyncio.get_running_loop()
    pieces: list[bytes] = []
    yield_at = loop.time() + _RENDER_SLICE_S
    for piece in service.metrics.render_pieces():
        pieces.append(piece)
        if loop.time() >= yield_at:
            await asyncio.sleep(0)
            yield_at = loop.time() + _RENDER_SLICE_S
    return Response(content=b"".join(pieces), media_type=CONTENT_TYPE)
