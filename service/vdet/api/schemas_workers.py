"""The stream worker processes as the API shows them (GET /v1/workers), on one node and, with
each worker's node, in a fleet (vdet.api.fleet_reads)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, Field

if TYPE_CHECKING:
    from vdet.workers.pool import WorkerPool


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
    node: str | None = Field(
        default=None,
        description="In a fleet (settings `cluster`), the node it runs on; null on one node.",
    )


class WorkersOut(BaseModel):
    mps: bool = Field(description="Whether this node's workers share their GPU through NVIDIA MPS.")
    workers: list[WorkerOut] = Field(
        description="The worker processes, then the spares; empty when streams run in the API "
        "process. In a fleet: every node's that answered, this node's first."
    )
    unanswered: list[str] = Field(
        default_factory=list,
        description="In a fleet, the nodes that did not answer in time (their workers are "
        "not listed).",
    )


def workers_out(pool: WorkerPool | None, node: str | None = None) -> WorkersOut:
    """This node's workers; `node` names it in a fleet. May wait briefly for the pool's lock:
    call it off the event loop."""
    if pool is None:
        return WorkersOut(mps=False, workers=[])
    return WorkersOut(
        mps=pool.mps_active,
        workers=[WorkerOut(**vars(w), node=node) for w in pool.workers()],
    )


__all__ = ["WorkerOut", "WorkersOut", "workers_out"]
