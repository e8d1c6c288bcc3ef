"""GET /v1/workers: the stream worker processes behind this API, for operators; in a fleet,
every node's (asked of each over NATS, vdet.api.fleet_reads)."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from vdet.api import fleet_reads
from vdet.api.deps import ServiceDep
from vdet.api.schemas_workers import WorkersOut, workers_out

router = APIRouter(prefix="/v1/workers", tags=["ops"])


@router.get("", response_model=WorkersOut, summary="Stream worker processes and their health")
async def list_workers(service: ServiceDep) -> WorkersOut:
    if service.fleet is not None:
        return await fleet_reads.workers(service)
    return await run_in_threadpool(workers_out, service.worker_pool)
