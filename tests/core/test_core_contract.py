"""vdet.core.contract is the one source of the shared numbers: its values, and everything that uses
them.

Every consumer's defaults are read back and compared with the contract (settings, CLI, TensorRT
plugin node, the C header the kernels and the plugin include), and the import graph is checked
so that the kernel layer never reaches into the pipeline.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest
from support.import_closure import imports_of, module_file
from support.tools import REPO

from vdet.cli import main as cli
from vdet.config.streams import DetectionDefaults
from vdet.core import contract
from vdet.core.contract import (
    EVAL_PARAMS,
    LetterboxTransform,
    PostprocessParams,
    compute_letterbox,
    letterbox_gain,
    letterbox_padding,
    rect_input_hw,
    resized_size,
    sample_scale,
    yuv_coefficients,
)
from vdet.core.model import ModelInfo
from vdet.core.types import ColourMatrix, ColourRange
from vdet.cuda import contract_header
from vdet.modelkit import export
from vdet.tensorrt.surgery import DecodeNmsAttributes

# ---- values ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("matrix", "colour_range", "expected"),
    [
        # (r_v, g_u, g_v, b_u): the textbook 1.596/0.392/0.813/2.017 for BT.601 limited, etc.
        (ColourMatrix.BT601, ColourRange.LIMITED, (1.5960, 0.3917, 0.8129, 2.0172)),
        (ColourMatrix.BT709, ColourRange.LIMITED, (1.7927, 0.2132, 0.5329, 2.1124)),
        (ColourMatrix.BT601, ColourRange.FULL, (1.4020, 0.3441, 0.7141, 1.7720)),
        (ColourMatrix.BT709, ColourRange.FULL, (1.5748, 0.1873, 0.4681, 1.8556)),
    ],
)
def test_yuv_coefficients(
    matrix: ColourMatrix, colour_range: ColourRange, expected: tuple[float, ...]
) -> None:
    k = yuv_coefficients(matrix, colour_range)
    assert (k.r_v, k.g_u, k.g_v, k.b_u) == pytest.approx(expected, abs=1e-4)
    limited = colour_range is ColourRange.LIMITED
    assert (k.y_offset, k.y_scale) == pytest.approx((16, 255 / 219) if limited else (0, 1))
    # Every coefficient is a float32 value: the kernels and the references use the same number.
    assert all(v == float(np.float32(v)) for v in vars(k).values())


@pytest.mark.parametrize(
    ("source_wh", "input_hw", "resized_wh", "padding"),
    [
        ((1920, 1080), (640, 640), (640, 360), (0, 140)),
        ((640, 640), (640, 640), (640, 640), (0, 0)),
        ((100, 50), (640, 640), (640, 320), (0, 160)),  # scaled up
        ((641, 640), (640, 640), (640, 639), (0, 0)),  # the odd pixel goes to the bottom
        ((1, 1000), (64, 64), (1, 64), (31, 0)),  # never narrower than one pixel
    ],
)
def test_letterbox_geometry(
    source_wh: tuple[int, int],
    input_hw: tuple[int, int],
    resized_wh: tuple[int, int],
    padding: tuple[int, int],
) -> None:
    gain = letterbox_gain(source_wh, input_hw)
    assert resized_size(source_wh, gain) == resized_wh
    assert letterbox_padding(resized_wh, input_hw) == padding
    t = compute_letterbox(source_wh, input_hw)
    assert t == LetterboxTransform(gain, *padding, input_hw, source_wh)
    assert t.resized_wh == resized_wh


@pytest.mark.parametrize(
    ("source_wh", "expected_hw"),
    [
        ((1920, 1080), (384, 640)),  # 16:9: 640x360 letterboxed, padded to 384
        ((1280, 720), (384, 640)),
        ((640, 480), (480, 640)),  # 4:3
        ((1080, 1920), (640, 384)),  # portrait
        ((1000, 1000), (640, 640)),  # square stays square
        ((4000, 100), (32, 640)),  # a sliver: at least one stride
        ((320, 180), (384, 640)),  # upscaled like the square letterbox
    ],
)
def test_rect_input_holds_the_letterboxed_frame(
    source_wh: tuple[int, int], expected_hw: tuple[int, int]
) -> None:
    rect_hw = rect_input_hw(source_wh, (640, 640), contract.STRIDE)
    assert rect_hw == expected_hw
    new_w, new_h = compute_letterbox(source_wh, (640, 640)).resized_wh
    assert new_h <= rect_hw[0] < new_h + contract.STRIDE or rect_hw[0] == 640
    assert new_w <= rect_hw[1] < new_w + contract.STRIDE or rect_hw[1] == 640


@pytest.mark.parametrize(
    ("source_wh", "input_hw", "stride"), [((0, 10), (640, 640), 32), ((10, 10), (640, 630), 32)]
)
def test_rect_input_refuses_impossible_sizes(
    source_wh: tuple[int, int], input_hw: tuple[int, int], stride: int
) -> None:
    with pytest.raises(ValueError, match=r"positive|multiple of the stride"):
        rect_input_hw(source_wh, input_hw, stride)


@pytest.mark.parametrize(("source_wh", "input_hw"), [((0, 10), (64, 64)), ((10, 10), (0, 64))])
def test_letterbox_rejects_empty_sizes(
    source_wh: tuple[int, int], input_hw: tuple[int, int]
) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        compute_letterbox(source_wh, input_hw)


def test_postprocess_defaults_are_the_contract() -> None:
    p = PostprocessParams()
    assert (p.conf_threshold, p.iou_threshold, p.top_k, p.max_det, p.class_agnostic) == (
        contract.CONF_THRESHOLD,
        contract.IOU_THRESHOLD,
        contract.TOP_K,
        contract.MAX_DET,
        contract.CLASS_AGNOSTIC,
    )
    assert p.classes is None
    assert contract.TOP_K <= contract.MAX_TOP_K
    e = EVAL_PARAMS
    assert (e.conf_threshold, e.iou_threshold, e.top_k, e.max_det) == (
        contract.EVAL_CONF_THRESHOLD,
        contract.EVAL_IOU_THRESHOLD,
        contract.EVAL_TOP_K,
        contract.EVAL_MAX_DET,
    )


# ---- every consumer takes its defaults from the contract ------------------------------------


def test_settings_defaults_are_the_contract() -> None:
    d = DetectionDefaults()
    assert (d.conf_threshold, d.iou_threshold, d.top_k, d.max_det) == (
        contract.CONF_THRESHOLD,
        contract.IOU_THRESHOLD,
        contract.TOP_K,
        contract.MAX_DET,
    )


def test_cli_defaults_are_the_contract() -> None:
    parser = cli.build_parser()
    detect = parser.parse_args(["detect", "image.jpg"])
    assert (detect.conf, detect.iou, detect.max_det) == (
        contract.CONF_THRESHOLD,
        contract.IOU_THRESHOLD,
        contract.MAX_DET,
    )
    exported = parser.parse_args(["export", "model.pt", "--output", "model.onnx"])
    assert exported.imgsz == contract.INPUT_SIZE
    assert inspect.signature(export.export_onnx).parameters["imgsz"].default == contract.INPUT_SIZE


def test_plugin_node_defaults_are_the_contract() -> None:
    a = DecodeNmsAttributes()
    assert DecodeNmsAttributes.from_params(PostprocessParams()) == a
    assert (a.score_threshold, a.iou_threshold, a.top_k, a.max_det, a.class_agnostic) == (
        contract.CONF_THRESHOLD,
        contract.IOU_THRESHOLD,
        contract.TOP_K,
        contract.MAX_DET,
        contract.CLASS_AGNOSTIC,
    )


def test_model_stride_default_is_the_contract() -> None:
    field = inspect.signature(ModelInfo).parameters["stride"]
    assert field.default == contract.STRIDE


# ---- the generated C header ----------------------------------------------------------------


def test_committed_header_is_what_the_contract_generates() -> None:
    """Fails after a contract change until `python -m vdet.cuda.contract_header` is run."""
    committed = (REPO / contract_header.HEADER).read_text(encoding="utf-8")
    assert committed == contract_header.render(), (
        f"{contract_header.HEADER} is stale: run `{contract_header.GENERATOR}`"
    )


def test_header_generator_writes_and_checks(tmp_path: Path) -> None:
    header = tmp_path / "vdet_contract.h"
    assert contract_header.main(["--check", "--output", str(header)]) == 1
    assert contract_header.main(["--output", str(header)]) == 0
    assert contract_header.main(["--check", "--output", str(header)]) == 0
    text = header.read_text(encoding="utf-8")
    assert f"#define VDET_PAD_VALUE {contract.PAD_VALUE}\n" in text
    assert f"#define VDET_MAX_TOP_K {contract.MAX_TOP_K}\n" in text
    assert "#define VDET_DEFAULT_IOU_THRESHOLD 0.45F\n" in text


def test_c_sources_take_the_numbers_from_the_header() -> None:
    """No C/CUDA source keeps its own copy of a contract number (they include the header)."""
    plugin = (REPO / "plugins" / "vdet_plugin.cpp").read_text(encoding="utf-8")
    assert '#include "kernels/vdet_contract.h"' in plugin
    for name in ("SCORE_THRESHOLD", "IOU_THRESHOLD", "TOP_K", "MAX_DET", "CLASS_AGNOSTIC"):
        assert f"= VDET_DEFAULT_{name};" in plugin
    kernel_dir = REPO / "service" / "vdet" / "cuda" / "kernels"
    kernels = (kernel_dir / "vdet_kernels.h").read_text(encoding="utf-8")
    assert '#include "vdet_contract.h"' in kernels
    preprocess = (kernel_dir / "preprocess.cuh").read_text(encoding="utf-8")
    for literal in ("114", "128.0f", "255.0f"):
        assert literal not in preprocess


# ---- import direction -----------------------------------------------------------------------


def _vdet_closure(root: str) -> set[str]:
    """Every vdet module `root` imports, directly or through other vdet modules."""
    seen: set[str] = set()
    todo = [root]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        todo += [name for name in imports_of(module) if module_file(name) is not None]
    return seen - {root}


# Every module of vdet.cuda (service/vdet/cuda/*.py).
KERNEL_LAYER = sorted(
    "vdet.cuda" if path.stem == "__init__" else f"vdet.cuda.{path.stem}"
    for path in (REPO / "service" / "vdet" / "cuda").glob("*.py")
)


def test_kernel_layer_is_listed() -> None:
    assert {"vdet.cuda.ops", "vdet.cuda.launch", "vdet.cuda.contract_header"} <= set(KERNEL_LAYER)


@pytest.mark.parametrize("module", KERNEL_LAYER)
def test_kernel_layer_imports_nothing_from_the_pipeline(module: str) -> None:
    reached = _vdet_closure(module)
    assert not {m for m in reached if m.startswith("vdet.inference")}, reached


def test_contract_imports_only_core_types() -> None:
    assert _vdet_closure("vdet.core.contract") <= {"vdet", "vdet.core", "vdet.core.types"}


@pytest.mark.parametrize("bits", [9, 10, 12, 16])
def test_sample_scale_limited_range_is_an_exact_division(bits: int) -> None:
    """Limited range: every `bits`-bit value lands on value / 2^(bits - 8), luma and chroma,
    in float32 with no rounding (so P016 of 8-bit video shifted up equals NV12)."""
    s = sample_scale(bits, ColourRange.LIMITED)
    values = np.arange(1 << bits, dtype=np.float32)
    luma = values * np.float32(s.scale)
    chroma = (values - np.float32(s.center)) * np.float32(s.scale) + np.float32(128)
    exact = values.astype(np.float64) / float(1 << (bits - 8))
    assert s.shift == 16 - bits
    np.testing.assert_array_equal(luma, exact)
    np.testing.assert_array_equal(chroma, exact)


def test_sample_scale_full_range_spans_0_to_255() -> None:
    s = sample_scale(10, ColourRange.FULL)
    assert np.float32(1023) * np.float32(s.scale) == pytest.approx(255.0, abs=1e-4)
    assert (np.float32(512) - np.float32(s.center)) * np.float32(s.scale) == 0.0
    assert float(np.float32(s.scale)) == s.scale  # exact in float32
    with pytest.raises(ValueError, match="9- to 16-bit"):
        sample_scale(8, ColourRange.FULL)
