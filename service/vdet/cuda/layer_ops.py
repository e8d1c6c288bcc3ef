"""Network layers as vdet kernels (vdet/cuda/kernels/layers.cu): a convolution's bias + SiLU in one
pass, and a stride-1 "same" max pool, on FP16 tensors in channels_last (NHWC) memory.

This module owns the host half of those kernels: checking that a tensor is what the kernel
reads (FP16, 4-d, NHWC-contiguous), the launch shapes, and queueing the launch on the caller's
stream (nothing here synchronises). Which layers of a network they replace is
vdet.inference.backends.torch_layers' business; how kernels compile and launch is
vdet.cuda.launch's.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from vdet.cuda.launch import Backend, CudaBackend, DeviceArray, KernelArg, stream_handle

BLOCK = 256
HALF = np.dtype(np.float16)


def nhwc_shape(view: DeviceArray, what: str) -> tuple[int, int, int, int]:
    """(N, C, H, W) of an FP16 tensor of shape (N, C, H, W) laid out NHWC without gaps
    (torch's channels_last); ValueError naming `what` otherwise."""
    if view.dtype != HALF or len(view.shape) != 4:
        raise ValueError(f"{what} must be a 4-d float16 tensor, got {view.shape} {view.dtype}")
    n, c, h, w = view.shape
    item = HALF.itemsize
    expected = (h * w * c * item, item, w * c * item, c * item)
    # Strides of size-1 dimensions do not matter (torch normalises them differently).
    if any(
        size > 1 and got != want
        for size, got, want in zip(view.shape, view.strides, expected, strict=True)
    ):
        raise ValueError(
            f"{what} must be channels_last-contiguous (NHWC), got strides {view.strides}"
        )
    return n, c, h, w


class LayerOps:
    """The layer kernels on one GPU (or on a test backend)."""

    def __init__(
        self, backend: Backend | None = None, *, device: int = 0, cache_dir: Path | None = None
    ) -> None:
        self.backend: Backend = (
            backend if backend is not None else CudaBackend(device, cache_dir=cache_dir)
        )

    def bias_silu_(self, x: object, bias: object, *, stream: object = None) -> None:
        """x = silu(x + bias) in place; `x` (N, C, H, W) FP16 channels_last, `bias` (C,) FP16."""
        view = self.backend.array(x)
        n, c, h, w = nhwc_shape(view, "x")
        bias_view = self.backend.array(bias)
        if bias_view.dtype != HALF or bias_view.shape != (c,) or not bias_view.is_contiguous:
            raise ValueError(
                f"bias must be a contiguous float16 ({c},) tensor, got "
                f"{bias_view.shape} {bias_view.dtype}"
            )
        count = n * c * h * w
        args = [ctypes.c_uint64(view.ptr), ctypes.c_uint64(bias_view.ptr)]
        self._launch(
            "vdet_layer_bias_silu_f16",
            count,
            stream,
            [*args, ctypes.c_uint64(count), ctypes.c_int(c)],
        )

    def max_pool_same(self, x: object, out: object, kernel: int, *, stream: object = None) -> None:
        """out = MaxPool2d(kernel, stride=1, padding=kernel // 2)(x); both (N, C, H, W) FP16
        channels_last, of one shape, not overlapping; `kernel` odd."""
        if isinstance(kernel, bool) or not isinstance(kernel, int) or kernel < 1 or kernel % 2 == 0:
            raise ValueError(f"kernel must be a positive odd int, got {kernel!r}")
        view = self.backend.array(x)
        out_view = self.backend.array(out)
        n, c, h, w = nhwc_shape(view, "x")
        if nhwc_shape(out_view, "out") != (n, c, h, w):
            raise ValueError(f"out must have the shape of x {view.shape}, got {out_view.shape}")
        if view.ptr < out_view.ptr + out_view.nbytes and out_view.ptr < view.ptr + view.nbytes:
            raise ValueError("out must not overlap x")
        sizes = [ctypes.c_int(v) for v in (n, h, w, c, kernel)]
        pointers = [ctypes.c_uint64(view.ptr), ctypes.c_uint64(out_view.ptr)]
        self._launch("vdet_layer_max_pool_nhwc_f16", n * c * h * w, stream, [*pointers, *sizes])

    def _launch(self, kernel: str, count: int, stream: object, args: Sequence[KernelArg]) -> None:
        """One thread per element, BLOCK to a block; nothing for an empty tensor."""
        if count == 0:
            return
        grid = ((count + BLOCK - 1) // BLOCK, 1, 1)
        self.backend.launch(kernel, grid, (BLOCK, 1, 1), 0, stream_handle(stream), args)
