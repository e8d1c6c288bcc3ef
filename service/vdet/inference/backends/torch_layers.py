"""Two kinds of layer of a converted network run as vdet kernels: conv bias + SiLU, max pool.

At batch 1 on a large GPU a YOLOv8 network's time is its kernels one after another. PyTorch
runs a convolution's bias as its own elementwise kernel after the convolution, then the SiLU as
another; its channels_last max pool launches too few blocks for SPPF's small feature maps
(YOLOv8s at 384x640: the bias adds and SiLUs were about a third of its kernel time, the three
5x5 pools another seventh; docs/gpu-data-path.md). `use_layer_kernels` rewrites the fx graph of a
network from `load_onnx_network` so that each Conv2d whose only user is a SiLU runs without its bias
and one kernel adds the bias and applies the SiLU in place, and each stride-1 "same" MaxPool2d
runs one thread per output (vdet/cuda/kernels/layers.cu, through vdet.cuda.layer_ops).

The layers take a `LayerKernels`: `LayerOps` on a GPU, or `ReferenceLayers` (torch ops, the
CPU reference the kernels are tested against, and what lets the rewrite itself be tested
without a GPU). A layer whose input is not what the kernels read (FP16, channels_last, on the
GPU) computes the same thing with torch ops instead, so a rewritten network runs anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch.nn import functional


class LayerKernels(Protocol):
    """What the rewritten layers call (vdet.cuda.layer_ops.LayerOps has this shape)."""

    def bias_silu_(self, x: object, bias: object, *, stream: object = None) -> None: ...

    def max_pool_same(
        self, x: object, out: object, kernel: int, *, stream: object = None
    ) -> None: ...


class ReferenceLayers:
    """The two layers with torch ops, in float32 with one rounding to the tensor's dtype at the
    end, as the kernels compute them. Any device, dtype and memory layout."""

    def bias_silu_(self, x: object, bias: object, *, stream: object = None) -> None:
        assert isinstance(x, torch.Tensor) and isinstance(bias, torch.Tensor)
        y = x.float() + bias.float().view(1, -1, 1, 1)
        x.copy_(functional.silu(y))

    def max_pool_same(self, x: object, out: object, kernel: int, *, stream: object = None) -> None:
        assert isinstance(x, torch.Tensor) and isinstance(out, torch.Tensor)
        out.copy_(functional.max_pool2d(x, kernel, stride=1, padding=kernel // 2))


def _on_kernels(x: torch.Tensor) -> bool:
    """Whether the kernels can read `x` as it is: FP16, 4-d, channels_last, on a GPU."""
    return (
        x.is_cuda
        and x.dtype == torch.float16
        and x.dim() == 4
        and x.is_contiguous(memory_format=torch.channels_last)
    )


class BiasSiLU(torch.nn.Module):
    """silu(x + bias) computed in place, for a Conv2d that runs without its bias."""

    def __init__(self, bias: torch.Tensor, kernels: LayerKernels) -> None:
        super().__init__()
        self.register_buffer("bias", bias.detach().clone())
        self._kernels = kernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.bias
        assert isinstance(bias, torch.Tensor)
        if _on_kernels(x) and bias.dtype == torch.float16:
            self._kernels.bias_silu_(x, bias, stream=torch.cuda.current_stream(x.device))
            return x
        return functional.silu(x + bias.view(1, -1, 1, 1))


class MaxPoolSame(torch.nn.Module):
    """MaxPool2d(kernel, stride=1, padding=kernel // 2) for an odd `kernel`."""

    def __init__(self, kernel: int, kernels: LayerKernels) -> None:
        super().__init__()
        self.kernel = kernel
        self._kernels = kernels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _on_kernels(x):
            out = torch.empty_like(x, memory_format=torch.channels_last)
            self._kernels.max_pool_same(
                x, out, self.kernel, stream=torch.cuda.current_stream(x.device)
            )
            return out
        return functional.max_pool2d(x, self.kernel, stride=1, padding=self.kernel // 2)


@dataclass(frozen=True)
class Rewritten:
    """How many layers `use_layer_kernels` replaced."""

    bias_silu: int
    max_pool: int


def _same_pool_kernel(pool: torch.nn.MaxPool2d) -> int | None:
    """The kernel size of a stride-1 "same" max pool with a square odd window, else None."""

    def pair(value: Any) -> tuple[int, int]:
        items = tuple(value) if isinstance(value, list | tuple) else (value, value)
        return int(items[0]), int(items[1])

    (k, k2), stride, padding, dilation = (
        pair(pool.kernel_size),
        pair(pool.stride),
        pair(pool.padding),
        pair(pool.dilation),
    )
    if k != k2 or k % 2 == 0 or stride != (1, 1) or dilation != (1, 1):
        return None
    if padding != (k // 2, k // 2) or pool.ceil_mode or pool.return_indices:
        return None
    return k


def use_layer_kernels(module: Any, kernels: LayerKernels) -> Rewritten:
    """Rewrite `module` (an fx.GraphModule from onnx2torch, SiLUs fused) in place so that its
    conv + SiLU pairs and same max pools run through `kernels`. Call before moving the module
    to its device and dtype: the bias buffers follow it there."""
    graph = module.graph
    bias_silu = max_pool = 0
    for node in list(graph.nodes):
        if node.op != "call_module":
            continue
        layer = module.get_submodule(node.target)
        if isinstance(layer, torch.nn.SiLU) and len(node.args) == 1 and not node.kwargs:
            (source,) = node.args
            if getattr(source, "op", None) != "call_module" or len(source.users) != 1:
                continue
            conv = module.get_submodule(source.target)
            if not isinstance(conv, torch.nn.Conv2d) or conv.bias is None:
                continue
            name = f"vdet_bias_silu_{bias_silu}"
            module.add_submodule(name, BiasSiLU(conv.bias.data, kernels))
            conv.bias = None
            node.target = name
            bias_silu += 1
        elif isinstance(layer, torch.nn.MaxPool2d) and len(node.args) == 1 and not node.kwargs:
            kernel = _same_pool_kernel(layer)
            if kernel is None:
                continue
            name = f"vdet_max_pool_{max_pool}"
            module.add_submodule(name, MaxPoolSame(kernel, kernels))
            node.target = name
            max_pool += 1
    module.delete_all_unused_submodules()
    module.recompile()
    return Rewritten(bias_silu=bias_silu, max_pool=max_pool)
