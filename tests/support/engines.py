"""The demo network quantized to INT8 once per session, for the TensorRT and modelkit tests
(their conftests expose `demo_int8`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vdet.core.assets import asset_path
from vdet.modelkit.quantize import QuantizeResult


@pytest.fixture(scope="session")
def demo_int8(tmp_path_factory: pytest.TempPathFactory) -> QuantizeResult:
    """`vdet quantize`'s INT8 Q/DQ model of the demo network, made once per test session from
    two frames of the sample clip: the tests that take it check what the model is made of and
    what TensorRT for RTX accepts, not the calibration's accuracy (docs/quantization.md
    measures that), and ModelOpt's fixed cost is most of a quantization's time."""
    from vdet.modelkit import quantize as q

    folder: Path = tmp_path_factory.mktemp("demo_int8")
    frames = q.collect_calibration_frames(asset_path("sample.mp4"), (640, 640), 2, every=100)
    return q.quantize_onnx(asset_path("demo.onnx"), folder / "demo.int8.onnx", frames, "max")
