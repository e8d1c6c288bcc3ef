"""The CUDA runtime calls the TensorRT path needs, each checked by `cuda_call`.

This module owns talking to the CUDA runtime through cuda-python (`cuda.bindings.runtime`, the
`tensorrt` extra): whether a GPU is there, which one (the engine cache is keyed by its name and
compute capability), and the device buffers and streams of the tensorrt backend. Every call goes
through `cuda_call`, which raises `CudaError` with the call's name and CUDA's message. Nothing
here knows about TensorRT or models.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vdet.core.extras import needs_extra


class CudaError(RuntimeError):
    """A CUDA runtime call failed, or there is no usable GPU."""


def runtime() -> Any:
    """`cuda.bindings.runtime`, or CudaError saying how to install it."""
    try:
        from cuda.bindings import runtime as rt
    except ImportError as exc:
        raise CudaError(
            needs_extra(
                "the CUDA runtime bindings (cuda-bindings of your CUDA major version)", "tensorrt"
            )
        ) from exc
    return rt


def cuda_call(result: Any, what: str) -> Any:
    """Unpack a cuda-python result `(err, *values)`; raise CudaError unless err is success."""
    rt = runtime()
    if isinstance(result, tuple):
        err, values = result[0], result[1:]
    else:
        err, values = result, ()
    if err != rt.cudaError_t.cudaSuccess:
        _, message = rt.cudaGetErrorString(err)
        text = message.decode(errors="replace") if isinstance(message, bytes) else str(message)
        raise CudaError(f"{what} failed: {text} ({err!r})")
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def gpu_count() -> int:
    """How many GPUs the CUDA runtime sees; 0 without a driver, a GPU or the bindings."""
    try:
        return int(cuda_call(runtime().cudaGetDeviceCount(), "cudaGetDeviceCount"))
    except CudaError:
        return 0


@dataclass(frozen=True)
class GpuIdentity:
    """What an engine is specific to: the GPU model and its compute capability."""

    name: str
    compute_capability: str  # "major.minor"


def gpu_identity(device: int = 0) -> GpuIdentity:
    """The name and compute capability of GPU `device`."""
    prop = cuda_call(runtime().cudaGetDeviceProperties(device), "cudaGetDeviceProperties")
    raw = prop.name
    name = raw.split(b"\0", 1)[0].decode(errors="replace") if isinstance(raw, bytes) else str(raw)
    return GpuIdentity(name=name.strip(), compute_capability=f"{prop.major}.{prop.minor}")
