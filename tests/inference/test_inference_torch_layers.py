"""The rewrite that runs conv bias + SiLU and same max pools through vdet's layer kernels
(vdet.inference.backends.torch_layers), on the CPU: which layers it replaces, and that the
rewritten demo network computes what the converted one does. The kernels themselves are tested
against their references in tests/cuda/test_cuda_layer_ops.py (GPU and emulator)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnx2torch")

from vdet.core.assets import asset_path  # noqa: E402
from vdet.inference.backends.torch import load_onnx_network  # noqa: E402
from vdet.inference.backends.torch_layers import (  # noqa: E402
    BiasSiLU,
    MaxPoolSame,
    ReferenceLayers,
    use_layer_kernels,
)
from vdet.inference.preprocess import letterbox  # noqa: E402

DEMO = asset_path("demo.onnx")
SAMPLE = DEMO.with_name("sample.mp4")


def _sample_input(input_hw: tuple[int, int]) -> torch.Tensor:
    av = pytest.importorskip("av")
    with av.open(str(SAMPLE)) as container:
        frame = next(container.decode(video=0)).to_ndarray(format="bgr24")
    image, _ = letterbox(frame, input_hw)
    return torch.from_numpy(image)[None]


def test_the_demo_network_rewritten_computes_the_same() -> None:
    plain = load_onnx_network(
        DEMO, batch=1, input_hw=(384, 640), device="cpu", fp16=False, channels_last=False,
        layer_kernels="off",
    )  # fmt: skip
    rewritten = copy.deepcopy(plain)
    counts = use_layer_kernels(rewritten, ReferenceLayers())
    assert (counts.bias_silu, counts.max_pool) == (57, 3)
    kinds = [type(m) for m in rewritten.modules()]
    assert kinds.count(BiasSiLU) == 57 and kinds.count(MaxPoolSame) == 3
    assert kinds.count(torch.nn.SiLU) == 0 and kinds.count(torch.nn.MaxPool2d) == 0
    convs = [m for m in rewritten.modules() if isinstance(m, torch.nn.Conv2d)]
    # Left with a bias: the head's six last convs (box and class), which no SiLU follows.
    assert sum(m.bias is not None for m in convs) == 6
    x = _sample_input((384, 640))
    with torch.inference_mode():
        got, want = rewritten(x), plain(x)
    np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-3, rtol=1e-5)


def test_the_reference_layers_compute_what_torch_does() -> None:
    """ReferenceLayers is what the kernels are held to: bias + SiLU in float32 with one
    rounding, and PyTorch's own max pool."""
    generator = torch.Generator().manual_seed(0)
    x = (torch.randn(2, 8, 5, 7, generator=generator) * 4).half()
    bias = torch.randn(8, generator=generator).half()
    y = x.clone()
    ReferenceLayers().bias_silu_(y, bias)
    want = torch.nn.functional.silu(x.float() + bias.float().view(1, -1, 1, 1)).half()
    assert torch.equal(y, want)
    out = torch.empty_like(x)
    ReferenceLayers().max_pool_same(x.float(), out, 5)
    pooled = torch.nn.functional.max_pool2d(x.float(), 5, stride=1, padding=2).half()
    assert torch.equal(out, pooled)


def test_pools_that_are_not_same_and_convs_with_other_users_stay() -> None:
    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
            self.act = torch.nn.SiLU()
            self.shared = torch.nn.Conv2d(4, 4, 1)
            self.act2 = torch.nn.SiLU()
            self.strided = torch.nn.MaxPool2d(3, stride=2, padding=1)
            self.even = torch.nn.MaxPool2d(2, stride=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.act(self.conv(x))
            z = self.shared(y)
            return self.act2(z) + z + self.strided(y).mean() + self.even(y).mean()

    module = torch.fx.symbolic_trace(Net())
    counts = use_layer_kernels(module, ReferenceLayers())
    assert (counts.bias_silu, counts.max_pool) == (1, 0)
    assert module.shared.bias is not None  # its output feeds the add too: left as it was


def test_the_gpu_setting_reaches_the_networks_the_backend_builds() -> None:
    """GpuTuning.layer_kernels false: build_gpu_pool sets the backend's flag, and network_for
    then builds (and caches apart) networks without the rewrite. On the CPU the rewrite never
    applies, so the flag is what is checked here; the GPU tests run both."""
    from vdet.gpu.devices import GpuTuning

    assert GpuTuning().layer_kernels is True
    from vdet.inference.backends.torch import TorchBackend

    backend = TorchBackend(DEMO, device="cpu", fp16=False, cuda_graph=False)
    assert backend.layer_kernels
    first = backend.network_for(1, (384, 640))
    backend.layer_kernels = False
    second = backend.network_for(1, (384, 640))
    assert first is not second and backend.network_for(1, (384, 640)) is second
