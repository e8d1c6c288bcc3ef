"""The preprocess and decode + NMS kernels at the GPU path's rectangular inputs (384x640 for
16:9 and 480x640 for 4:3 at a 640 model, 640x384 for portrait), against the CPU references.

Same harnesses as test_gpu_kernels.py (`[cuda]` on the GPU, marked `gpu`; `[emu]` on the CPU
emulator) and the same tolerances, reused from there: letterbox padding and unscaled frames bit
exact, resized values within 1/255 + 1e-7 (OpenCV's fixed-point weights); decode + NMS the
same kept anchors in the same order, classes and scores exactly, boxes within 1e-4 relative.
Nothing in either kernel is sized for a square input or for 8400 anchors (the launch takes
the output's H, W and the head's anchor count); these tests hold them to it.

The emulator runs one representative case of each test (it is slow: the whole file there
took 110 s on 2 cores); the GPU runs them all.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
import pytest
from support.kernels.harness import DEMO_MODEL, Harness
from test_cuda_ops import (
    assert_same_detections,
    check_letterbox,
    random_head,
    random_nv12,
    run_decode_nms,
    run_nv12,
    sample_frames,
)

from vdet.core.contract import rect_input_hw
from vdet.cuda.ops import YuvMatrix, nv12_to_bgr, yuv_coefficients
from vdet.inference.postprocess import PostprocessParams
from vdet.inference.preprocess import letterbox

MODEL_HW = (640, 640)

RECT_CASES = [
    pytest.param((1920, 1080), (384, 640), id="1080p-384x640"),
    pytest.param((1280, 720), (384, 640), id="720p-384x640"),
    pytest.param((1279, 719), (384, 640), id="odd-16:9-384x640"),
    pytest.param((640, 480), (480, 640), id="vga-480x640-no-resize"),
    pytest.param((1440, 1080), (480, 640), id="4:3-480x640"),
    pytest.param((1080, 1920), (640, 384), id="portrait-640x384"),
]


def _on_the_gpu_only(harness: Harness) -> None:
    """Skip a case on the emulator, where one case of the test stands for the rest."""
    if harness.kind == "emu":
        pytest.skip("the emulator runs one case of this test; the GPU runs them all")


def _anchors(input_hw: tuple[int, int]) -> int:
    """YOLOv8's anchor count at an input: strides 8, 16 and 32."""
    H, W = input_hw
    return sum((H // s) * (W // s) for s in (8, 16, 32))


def test_the_cases_are_the_inputs_the_service_chooses() -> None:
    for case in RECT_CASES:
        source_wh, input_hw = case.values
        assert rect_input_hw(source_wh, MODEL_HW, 32) == input_hw  # type: ignore[arg-type]
    assert (_anchors((640, 640)), _anchors((384, 640)), _anchors((480, 640))) == (8400, 5040, 6300)


@pytest.mark.parametrize(("source_wh", "input_hw"), RECT_CASES)
@pytest.mark.parametrize(("matrix", "full_range"), [("bt709", False), ("bt601", True)])
def test_letterbox_nv12_into_a_rect_input_matches_reference(
    harness: Harness,
    source_wh: tuple[int, int],
    input_hw: tuple[int, int],
    matrix: YuvMatrix,
    full_range: bool,
) -> None:
    """Random NV12 planes (own row pitches) vs `nv12_to_bgr` then `letterbox()` at the rect
    input: padding and unscaled frames bit exact, resized values within 1/255 + 1e-7."""
    if (source_wh, matrix) != ((1920, 1080), "bt709"):
        _on_the_gpu_only(harness)
    rng = np.random.default_rng(source_wh[0] * 3 + source_wh[1] + input_hw[0])
    w, h = source_wh
    y, uv = random_nv12(rng, w, h)
    got = run_nv12(harness, [(y, uv)], input_hw, matrix, full_range, pitch_pad=5)
    assert got.shape == (1, 3, *input_hw)
    bgr = nv12_to_bgr(y, uv, yuv_coefficients(matrix, full_range))
    want, t = letterbox(bgr, input_hw)
    check_letterbox(got[0], want, source_wh, t.resized_wh, (t.pad_x, t.pad_y))


def test_letterbox_nv12_mixed_sizes_into_one_rect_batch(harness: Harness) -> None:
    """1080p and 720p (both 384x640) in one launch, as a batched runner's staging does frame
    by frame: each as it is alone, same tolerances."""
    rng = np.random.default_rng(5)
    planes = [random_nv12(rng, 1920, 1080), random_nv12(rng, 1280, 720)]
    got = run_nv12(harness, planes, (384, 640), "bt709", False)
    for i, (y, uv) in enumerate(planes):
        h, w = y.shape
        want, t = letterbox(nv12_to_bgr(y, uv, yuv_coefficients("bt709", False)), (384, 640))
        check_letterbox(got[i], want, (w, h), t.resized_wh, (t.pad_x, t.pad_y))


@pytest.mark.parametrize("input_hw", [(384, 640), (480, 640)])
def test_letterbox_sample_clip_nv12_at_rect(harness: Harness, input_hw: tuple[int, int]) -> None:
    """The sample clip's 1080p NV12 surfaces (PyAV, BT.709 limited) at 384x640 (its own rect
    input) and 480x640 (a 4:3 batch's: more padding, same scale): vs `nv12_to_bgr` +
    `letterbox()` within 1/255 + 1e-7, and vs the CPU detector's input (PyAV's BGR, which
    interpolates chroma, letterboxed) within a mean of 2/255 and a max of 12/255."""
    _on_the_gpu_only(harness)
    images, surfaces, colorspace = sample_frames()
    assert colorspace == 1  # BT.709
    h = 1080
    ys, uvs = [], []
    for surface in surfaces:
        tensor = harness.put(surface)
        ys.append(tensor[:h])
        uvs.append(tensor[h:])
    out = harness.full((len(surfaces), 3, *input_hw), np.nan, np.float32)
    transforms = harness.ops.letterbox_nv12(ys, uvs, out, matrix="bt709", stream=harness.stream)
    got = harness.get(out)
    coefficients = yuv_coefficients("bt709", False)
    for i, (surface, t) in enumerate(zip(surfaces, transforms, strict=True)):
        assert t.input_hw == input_hw
        want, _ = letterbox(nv12_to_bgr(surface[:h], surface[h:], coefficients), input_hw)
        check_letterbox(got[i], want, (1920, 1080), t.resized_wh, (t.pad_x, t.pad_y))
        pyav, _ = letterbox(images[i], input_hw)
        diff = np.abs(got[i] - pyav)
        assert diff.mean() < 2 / 255 and diff.max() < 12 / 255


@pytest.mark.parametrize("input_hw", [(384, 640), (480, 640)])
@pytest.mark.parametrize(
    ("head_kwargs", "param_kwargs"),
    [
        pytest.param(dict(batch=2, nc=80), {}, id="sparse"),
        pytest.param(dict(batch=1, nc=80, dense=True), {}, id="dense"),
        pytest.param(dict(batch=3, nc=80), dict(classes=frozenset({0, 2, 79})), id="classes"),
        pytest.param(dict(batch=2, nc=80, dense=True), dict(top_k=100, max_det=1000), id="topk"),
    ],
)
def test_decode_nms_at_rect_anchor_counts_matches_reference(
    harness: Harness,
    input_hw: tuple[int, int],
    head_kwargs: dict[str, Any],
    param_kwargs: dict[str, Any],
) -> None:
    """Random heads with a rect input's anchors (5040, 6300) vs `decode_and_nms_image`: same
    anchors in the same order, classes and scores exact, boxes within 1e-4 relative."""
    if "dense" not in head_kwargs or param_kwargs:
        _on_the_gpu_only(harness)
    n = _anchors(input_hw)
    rng = np.random.default_rng(n + len(str(head_kwargs)) * 7 + len(str(param_kwargs)))
    raw = random_head(rng, n=n, **head_kwargs)
    params = PostprocessParams(**param_kwargs)
    counts = assert_same_detections(*run_decode_nms(harness, raw, params), raw, params)
    assert sum(counts) > 0
    # The workspace the runner's op sizes from the head's shape fits too.
    assert_same_detections(*run_decode_nms(harness, raw, params, workspace=True), raw, params)


@cache
def demo_model_heads_at(input_hw: tuple[int, int]) -> np.ndarray:
    """The demo model's raw heads (ONNX Runtime, CPU; its height and width are dynamic) for the
    five sample frames letterboxed at `input_hw`."""
    import onnxruntime as ort

    images, _, _ = sample_frames()
    batch = np.stack([letterbox(image, input_hw)[0] for image in images])
    session = ort.InferenceSession(str(DEMO_MODEL), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return np.asarray(session.run(None, {name: batch})[0], np.float32)


@pytest.mark.parametrize("input_hw", [(384, 640), (480, 640)])
@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_decode_nms_demo_model_at_rect(
    harness: Harness, input_hw: tuple[int, int], fp16: bool
) -> None:
    """The demo model's heads on five sample frames at a rect input (one batch) vs
    `decode_and_nms_image`: same anchors, classes and scores exactly, boxes within 1e-4
    relative; and objects are found."""
    if fp16 or input_hw != (384, 640):
        _on_the_gpu_only(harness)
    raw = demo_model_heads_at(input_hw)
    assert raw.shape[2] == _anchors(input_hw)
    if fp16:
        raw = raw.astype(np.float16)
    params = PostprocessParams()
    counts = assert_same_detections(*run_decode_nms(harness, raw, params), raw, params)
    assert sum(counts) > 0
