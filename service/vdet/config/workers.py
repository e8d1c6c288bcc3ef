"""Stream worker processes behind the one API (`workers`; docs/workers.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from vdet.config.base import Strict


class WorkerSettings(Strict):
    """Stream worker processes: where `vdet serve` runs its streams (docs/workers.md).

    One process's threads share one Python interpreter lock, which bounds how many streams one
    process carries (about 16 real-time 1080p streams with a GPU backend).
    With worker processes, the API process keeps the API, the results hub, WebSockets and
    /metrics, and each worker runs the decoding and detection of its share of the streams.
    """

    processes: Literal["auto"] | int = Field(
        default="auto",
        description="Worker processes per GPU (GPU backends), or in all (CPU). 0 runs every "
        "stream inside the API process. auto: on a GPU node, enough per GPU for that GPU's "
        "share of max_streams at streams_per_process each (at most 16 per GPU, which then take "
        "more streams each); on the CPU, 0.",
    )
    streams_per_process: int = Field(
        default=8,
        ge=1,
        le=256,
        description="Most streams one worker process takes (8 real-time 1080p30 streams per "
        "process held with no drops on an H200; see docs/workers.md).",
    )
    start_timeout_s: float = Field(
        default=180.0,
        ge=1.0,
        le=3600.0,
        description="How long a worker may take to load its model and report ready.",
    )
    call_timeout_s: float = Field(
        default=30.0,
        ge=0.5,
        le=600.0,
        description="How long a control call (add, change, remove, status) may wait for its "
        "worker before it fails with 503.",
    )
    restart: bool = Field(
        default=True,
        description="Restart a worker that dies and re-add its streams there; false leaves "
        "its streams failed.",
    )
    spares: int = Field(
        default=1,
        ge=0,
        le=8,
        description="Idle, fully started worker processes kept ready per GPU (in all on the "
        "CPU), so a dead worker's streams move to one at once instead of waiting for a new "
        "process to load its model. Each costs one worker process's memory (and a CUDA "
        "context on a GPU). 0 disables; none run without worker processes or with "
        "restart false.",
    )

    @field_validator("processes")
    @classmethod
    def _process_count(cls, value: Literal["auto"] | int) -> Literal["auto"] | int:
        if value != "auto" and not (isinstance(value, int) and 0 <= value <= 64):
            raise ValueError("processes must be 'auto' or a whole number from 0 to 64")
        return value
