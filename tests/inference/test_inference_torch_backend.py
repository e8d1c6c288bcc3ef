"""The torch backend's ONNX conversion on the CPU: same raw head as ONNX Runtime, and a module
that a CUDA graph can capture (checked without a GPU on torch's meta device).

On the meta device tensors have shapes but no data: a forward pass there fails on any read of
a device tensor's values (`.item()`, `.tolist()`, `bool(t)`), exactly what would synchronise
the host during CUDA graph capture. Host-resident constants (shapes, split sizes) stay on the
CPU and may be read. Skipped without onnx2torch.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("onnx2torch")

from vdet.core.assets import asset_path
from vdet.inference.backends import create_backend, known_backends
from vdet.inference.backends.onnxruntime import OnnxRuntimeBackend
from vdet.inference.backends.torch import TorchBackend, load_onnx_network

DEMO = asset_path("demo.onnx")


@pytest.fixture(scope="module")
def demo_inputs() -> np.ndarray:
    return np.random.default_rng(0).random((3, 3, 640, 640), dtype=np.float32)


def test_cpu_module_matches_onnxruntime(demo_inputs: np.ndarray) -> None:
    """FP32 on the CPU: boxes (input pixels, up to 640) within 2e-3, scores within 1e-5."""
    with TorchBackend(DEMO, device="cpu", batch=2) as backend:
        assert backend.max_batch == 2 and backend.device.startswith("cpu (torch")
        raw = backend.infer(demo_inputs)  # 3 images: a full chunk and a zero-padded one
    with OnnxRuntimeBackend(DEMO, threads=2) as reference:
        expected = reference.infer(demo_inputs)
    assert raw.shape == expected.shape == (3, 10, 8400) and raw.dtype == np.float32
    np.testing.assert_allclose(raw[:, :4], expected[:, :4], atol=2e-3, rtol=0)
    np.testing.assert_allclose(raw[:, 4:], expected[:, 4:], atol=1e-5, rtol=0)


@pytest.mark.parametrize("batch", [1, 4])
def test_converted_module_has_no_device_reads(batch: int) -> None:
    network = load_onnx_network(
        DEMO, batch=batch, input_hw=(640, 640), device="cpu", fp16=False, channels_last=False
    )
    on_meta = network.to("meta")
    out = on_meta(torch.empty((batch, 3, 640, 640), device="meta"))
    assert out.device.type == "meta" and tuple(out.shape) == (batch, 10, 8400)


def test_fp16_channels_last_module_runs() -> None:
    """FP16 on the CPU is slow but exercises the same dtype and layout as on the GPU."""
    network = load_onnx_network(DEMO, batch=1, input_hw=(640, 640), device="cpu")
    params = list(network.parameters())
    assert params and all(p.dtype == torch.float16 for p in params)
    conv = next(p for p in params if p.dim() == 4)
    assert conv.is_contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        x = torch.zeros((1, 3, 640, 640), dtype=torch.float16)
        out = network(x.contiguous(memory_format=torch.channels_last))
    assert out.dtype == torch.float16 and tuple(out.shape) == (1, 10, 8400)


def test_registered_with_priority_200_and_unavailable_without_cuda() -> None:
    from vdet.inference import backends

    assert "torch" in known_backends()
    spec = backends._REGISTRY["torch"]
    assert spec.priority == 200 and spec.accepts(DEMO) and not spec.accepts(Path("m.engine"))
    if not torch.cuda.is_available():
        assert not spec.is_available()
        with create_backend("auto", DEMO) as backend:
            assert backend.name == "onnxruntime"


def test_onnx2torch_imports_without_torchvision() -> None:
    """The GPU image has no torchvision: onnx2torch must still import (and torchvision stay
    absent for everyone else)."""
    code = (
        "import sys; sys.modules['torchvision'] = None\n"
        "from vdet.inference.backends.torch import import_onnx2torch\n"
        "module = import_onnx2torch(); assert hasattr(module, 'convert')\n"
        "assert sys.modules.get('torchvision') is None\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_yolov8_silu_is_one_module_and_a_shared_sigmoid_is_left_alone() -> None:
    from vdet.inference.backends.torch import _fuse_silu

    network = load_onnx_network(
        DEMO, batch=1, input_hw=(640, 640), device="cpu", fp16=False, channels_last=False
    )
    kinds = [type(m).__name__ for m in network.modules()]
    # 57 Sigmoid + Mul pairs of the backbone and head became SiLU; the class scores keep theirs.
    assert kinds.count("SiLU") == 57 and kinds.count("Sigmoid") == 1

    from onnx2torch.node_converters.binary_math_operations import OnnxBinaryMathOperation

    class Gated(torch.nn.Module):
        def __init__(self, share: bool) -> None:
            super().__init__()
            self.share = share
            self.gate = torch.nn.Sigmoid()
            self.mul = OnnxBinaryMathOperation("Mul")

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            g = self.gate(x)
            # Shared: the sigmoid is an output too, so x * g must stay as it is.
            return self.mul(x, g), (g if self.share else x)

    class AsOnnx2Torch(torch.fx.Tracer):  # every module a node, as in onnx2torch's graphs
        def is_leaf_module(self, m: torch.nn.Module, qualified_name: str) -> bool:
            return isinstance(m, OnnxBinaryMathOperation) or super().is_leaf_module(
                m, qualified_name
            )

    x = torch.randn(8)
    for share, expected in ((True, 0), (False, 1)):
        root = Gated(share)
        traced = torch.fx.GraphModule(root, AsOnnx2Torch().trace(root))
        assert _fuse_silu(traced) == expected
        product, _ = traced(x)
        torch.testing.assert_close(product, x * torch.sigmoid(x))
