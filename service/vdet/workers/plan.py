"""How many stream worker processes `vdet serve` starts, and which GPU each one runs on.

A pure decision from the settings and the number of visible GPUs: nothing is started here, and
no CUDA context is created (the GPU count comes from the driver API, which makes none).

Rules (`workers.processes`):
- 0: every stream runs inside the API process (one interpreter, as before worker processes).
- a number N: N processes per GPU on a GPU node, N in all on the CPU.
- auto: on a GPU node, per GPU enough processes for that GPU's share of `max_streams` at
  `streams_per_process` each, at most MAX_AUTO_PROCESSES_PER_GPU; where that many cannot carry
  the share at `streams_per_process`, each takes more, so that auto always carries
  `max_streams`. On the CPU, 0 (ONNX Runtime already spreads one frame over every core, and a
  laptop's demo needs no second interpreter).
A GPU node is one with a visible NVIDIA GPU and a backend other than onnxruntime.

Spares (`workers.spares`): idle worker processes, started like the others, that take a dead
worker's place at once. That many per GPU on a GPU node, in all on the CPU; none when no worker
process runs or dead workers are not restarted (`workers.restart: false`). They never change
how many workers `auto` plans, nor the ONNX Runtime threads each CPU worker gets: an idle
spare uses no core, and a promoted one takes the cores of the worker it replaces.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Callable

from vdet.config.settings import Settings

log = logging.getLogger(__name__)

# More worker processes than this per GPU buy nothing: 8 carried 64 real-time 1080p streams on
# an H200 (docs/workers.md), and each costs a CUDA context and a model copy.
MAX_AUTO_PROCESSES_PER_GPU = 16


@dataclasses.dataclass(frozen=True)
class WorkerPlan:
    """The worker processes to start: `gpus[i]` is worker i's GPU (None on the CPU)."""

    gpus: tuple[int | None, ...]
    streams_per_process: int
    # ONNX Runtime threads per CPU worker, so that N workers do not each start one per core.
    cpu_threads: int | None = None
    # The idle spare processes to keep ready: `spare_gpus[i]` is spare i's GPU (None on the CPU).
    spare_gpus: tuple[int | None, ...] = ()

    @property
    def processes(self) -> int:
        return len(self.gpus)

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        """The distinct GPUs the workers run on, in order."""
        return tuple(dict.fromkeys(g for g in self.gpus if g is not None))

    def shared_gpus(self) -> tuple[int, ...]:
        """GPUs that more than one worker runs on (where MPS helps)."""
        return tuple(g for g in self.gpu_indices if self.gpus.count(g) > 1)


def visible_gpu_count() -> int:
    """NVIDIA GPUs this process could use (CUDA_VISIBLE_DEVICES applies); 0 without a driver
    or without cuda-python. cuInit loads the driver but creates no context."""
    try:
        from cuda.bindings import driver
    except ImportError:
        return 0
    try:
        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return 0
        err, count = driver.cuDeviceGetCount()
    except Exception:  # no driver library: cuda-python raises instead of returning an error
        return 0
    return int(count) if err == driver.CUresult.CUDA_SUCCESS else 0


def plan_workers(
    settings: Settings, gpu_count: Callable[[], int] = visible_gpu_count
) -> WorkerPlan:
    """The plan for `settings` on this machine (module docstring)."""
    w = settings.workers
    gpus: list[int] = []
    if settings.backend != "onnxruntime":
        count = gpu_count()
        if count > 0:
            gpus = settings.gpu.devices if settings.gpu.devices is not None else list(range(count))
            if missing := [g for g in gpus if not 0 <= g < count]:
                raise ValueError(
                    f"gpu.devices {missing} do not exist; this node has {count} GPU(s)"
                )
    if gpus:
        per_process = w.streams_per_process
        if w.processes == "auto":
            share = math.ceil(settings.max_streams / len(gpus))
            per_gpu = min(MAX_AUTO_PROCESSES_PER_GPU, math.ceil(share / per_process))
            # Past the process cap the workers take more streams each rather than refuse the
            # streams max_streams admits (at 160 streams a GPU: 10 each instead of a limit
            # of 128).
            per_process = max(per_process, math.ceil(share / per_gpu))
        else:
            per_gpu = w.processes
        # Workers of a GPU are numbered together, so a GPU's workers sit side by side.
        return WorkerPlan(
            gpus=tuple(g for g in gpus for _ in range(per_gpu)),
            streams_per_process=per_process,
            spare_gpus=tuple(g for g in gpus for _ in range(_spares(settings, per_gpu))),
        )
    processes = 0 if w.processes == "auto" else w.processes
    threads = max(1, (os.cpu_count() or 1) // processes) if processes else None
    return WorkerPlan(
        gpus=(None,) * processes,
        streams_per_process=w.streams_per_process,
        cpu_threads=threads,
        spare_gpus=(None,) * _spares(settings, processes),
    )


def stream_capacity(settings: Settings, plan: WorkerPlan) -> int:
    """How many streams this server can run: `max_streams`, less where the worker processes'
    shares (processes x streams_per_process) or the GPUs' caps (`gpu.max_streams_per_gpu` x
    the GPUs the workers use) are smaller. What a fleet node offers the fleet by default."""
    capacity = settings.max_streams
    if plan.processes:
        capacity = min(capacity, plan.processes * plan.streams_per_process)
    per_gpu = settings.gpu.max_streams_per_gpu
    if per_gpu is not None and plan.gpu_indices:
        capacity = min(capacity, per_gpu * len(plan.gpu_indices))
    return capacity


def _spares(settings: Settings, workers: int) -> int:
    """Spares per GPU (or in all on the CPU) beside `workers` worker processes."""
    if workers == 0 or not settings.workers.restart:
        return 0
    return settings.workers.spares


def child_visible_devices(gpu: int, parent_visible: str | None) -> str:
    """CUDA_VISIBLE_DEVICES for a worker of GPU `gpu` (an index among the parent's visible GPUs):
    that one GPU, named as the parent names it, so inside the worker it is device 0."""
    if parent_visible:
        names = [n.strip() for n in parent_visible.split(",") if n.strip()]
        if 0 <= gpu < len(names):
            return names[gpu]
    return str(gpu)
