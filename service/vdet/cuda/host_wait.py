"""How host threads wait for the GPU: the scheduling flag of each GPU's primary CUDA context.

Every stream has threads that wait for the GPU many times a frame: inside NVDEC's `Decode`
(PyNvVideoCodec maps the decoded surface and synchronises), and on the event after a frame's
graph. CUDA's default (`auto`) spins while waiting whenever the process has fewer contexts than
the machine has cores, which is always for us: one spinning thread per waiting stream, and
dozens of busy threads competing for the cores with the few that have work to do. `block`
asks CUDA to make a waiting thread sleep until the GPU signals instead. The flag is per
context, and PyTorch, PyNvVideoCodec (`cudacontext=0`) and vdet's kernels share the device's
primary context.

What it does and does not reach, measured by the lab's bench/gpu/wait_probe.py: a default torch
event's `synchronize()` spun in every mode, and NVDEC's `Decode` cost the same
CPU in every mode. So the per-frame wait that matters is made blocking where it happens: the
graph runners wait on a blocking-sync event under host wait `block` (GpuTuning)
(vdet.gpu.graphs). This flag covers the rest (stream and device synchronisations,
device-to-host copies), with the same wake-up cost.

Set while the context may already be active (the model is usually loaded first): then through
`cuCtxSetFlags` (CUDA 12.1+), else for when it is created (`cuDevicePrimaryCtxSetFlags`).
"""

from __future__ import annotations

import logging
from typing import Any, Literal

log = logging.getLogger(__name__)

HostWait = Literal["block", "spin", "yield", "auto"]
HOST_WAITS: tuple[HostWait, ...] = ("block", "spin", "yield", "auto")

# CU_CTX_SCHED_* of cuda.h: the three low bits of a context's flags.
_SCHED_FLAGS: dict[str, int] = {"auto": 0x00, "spin": 0x01, "yield": 0x02, "block": 0x04}
_SCHED_MASK = 0x07


def _check(result: Any, what: str) -> Any:
    from vdet.cuda.launch import check

    return check(result, what)


def sched_flags(flags: int, mode: str) -> int:
    """`flags` with their scheduling bits replaced by those of `mode` (other bits kept)."""
    if mode not in _SCHED_FLAGS:
        raise ValueError(f"host wait must be one of {HOST_WAITS}, got {mode!r}")
    return (flags & ~_SCHED_MASK) | _SCHED_FLAGS[mode]


def set_host_wait(device_index: int, mode: str) -> None:
    """Make threads waiting on GPU `device_index` wait the `mode` way (module docstring).

    Raises ValueError for an unknown mode and vdet.cuda.launch.KernelError (naming the CUDA
    call) when the driver refuses; ImportError without cuda-python.
    """
    sched_flags(0, mode)  # rejects an unknown mode before touching CUDA
    from cuda.bindings import driver

    _check(driver.cuInit(0), "cuInit")
    device = _check(driver.cuDeviceGet(device_index), f"cuDeviceGet({device_index})")
    flags, active = _check(driver.cuDevicePrimaryCtxGetState(device), "cuDevicePrimaryCtxGetState")
    if not active:
        _check(
            driver.cuDevicePrimaryCtxSetFlags(device, sched_flags(int(flags), mode)),
            "cuDevicePrimaryCtxSetFlags",
        )
        return
    context = _check(driver.cuDevicePrimaryCtxRetain(device), "cuDevicePrimaryCtxRetain")
    try:
        _check(driver.cuCtxPushCurrent(context), "cuCtxPushCurrent")
        try:
            current = int(_check(driver.cuCtxGetFlags(), "cuCtxGetFlags"))
            _check(driver.cuCtxSetFlags(sched_flags(current, mode)), "cuCtxSetFlags")
        finally:
            _check(driver.cuCtxPopCurrent(), "cuCtxPopCurrent")
    finally:
        _check(driver.cuDevicePrimaryCtxRelease(device), "cuDevicePrimaryCtxRelease")


def host_wait_of(device_index: int) -> str:
    """The scheduling mode of GPU `device_index`'s primary context (diagnostics, tests)."""
    from cuda.bindings import driver

    _check(driver.cuInit(0), "cuInit")
    device = _check(driver.cuDeviceGet(device_index), f"cuDeviceGet({device_index})")
    flags, active = _check(driver.cuDevicePrimaryCtxGetState(device), "cuDevicePrimaryCtxGetState")
    if active:  # the live context's own flags (cuCtxSetFlags changes those)
        context = _check(driver.cuDevicePrimaryCtxRetain(device), "cuDevicePrimaryCtxRetain")
        try:
            _check(driver.cuCtxPushCurrent(context), "cuCtxPushCurrent")
            try:
                flags = _check(driver.cuCtxGetFlags(), "cuCtxGetFlags")
            finally:
                _check(driver.cuCtxPopCurrent(), "cuCtxPopCurrent")
        finally:
            _check(driver.cuDevicePrimaryCtxRelease(device), "cuDevicePrimaryCtxRelease")
    bits = int(flags) & _SCHED_MASK
    return next((name for name, value in _SCHED_FLAGS.items() if value == bits), hex(bits))


__all__ = ["HOST_WAITS", "HostWait", "host_wait_of", "sched_flags", "set_host_wait"]
