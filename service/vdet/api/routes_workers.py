"""GET /v1/workers: the stream worker processes behind this API, for operators."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter
from pydantic import BaseModel, Field

from vdet.api.deps import ServiceDep

router = APIRouter(prefix="/v1/workers", tags=["ops"])


class WorkerOut(BaseModel):
    name: str = Field(
        description="The worker's name (`w0`, `w1`, ...; spares `spare0`, ...); streams show "
        "it too, and so does the `worker` label of its metrics."
    )
    role: Literal["worker", "spare"] = Field(
        description="worker: runs streams. spare: an idle, fully started process that takes "
        "the place (and name) of a worker that dies; a new spare then starts."
    )
    gpu: str = Field(description="The GPU it runs on, or 'cpu'.")
    pid: int | None = Field(
        description="Its process id; null before its first start, and for a spare whose "
        "process has just taken a worker's place."
    )
    alive: bool = Field(description="Whether it runs and answers now (false while restarting).")
    streams: int = Field(description="Streams placed on it (a spare: 0).")
    restarts: int = Field(
        description="Times it died and was started again (a worker: also when a spare's "
        "process took its place)."
    )
    last_exit: str | None = Field(description="How its last process ended, if one did.")


class WorkersOut(BaseModel):
    mps: bool = Field(description="Whether the workers share their GPU through NVIDIA MPS.")
    workers: list[WorkerOut] = Field(
        description="The worker processes, then the spares; empty when streams run in the API "
        "process."
    )


@router.get("", response_model=WorkersOut, summary="Stream worker processes and their health")
def list_workers(service: ServiceDep) -> WorkersOut:
    pool = service.worker_pool
    if pool is None:
        return WorkersOut(mps=False, workers=[])
    return WorkersOut(
        mps=pool.mps_active,
        workers=[WorkerOut(**vars(w)) for w in pool.workers()],
    )
