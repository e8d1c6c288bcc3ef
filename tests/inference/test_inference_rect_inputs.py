"""Rectangular inputs: a frame is letterboxed into the smallest stride-multiple input that
holds it, where the backend takes such inputs, and gives the same boxes as the square input.
(The geometry itself, `rect_input_hw`, is tested with the rest of the contract: test_contract.py.)

Real parts: the bundled demo model (ONNX, dynamic height and width) on ONNX Runtime, frames of
the bundled sample clip (1920x1080 H.264).
"""

from __future__ import annotations

from typing import Any

import av
import numpy as np
import pytest

from vdet.core.assets import asset_path
from vdet.inference.detector import Detector
from vdet.tracking.bytetrack import box_iou


@pytest.fixture(scope="module")
def frames() -> list[np.ndarray]:
    out = []
    with av.open(str(asset_path("sample.mp4"))) as container:
        for i, frame in enumerate(container.decode(video=0)):
            if i % 25 == 0:
                out.append(frame.to_ndarray(format="bgr24"))
            if len(out) == 6:
                break
    return out


@pytest.fixture(scope="module")
def detectors() -> dict[str, Detector]:
    return {
        shape: Detector.open(asset_path("demo.onnx"), "onnxruntime", input_shape=shape, threads=1)
        for shape in ("rect", "square")
    }


def test_the_demo_model_takes_rectangular_inputs_and_the_backend_checks_them(
    detectors: dict[str, Detector],
) -> None:
    rect = detectors["rect"]
    assert rect.info.dynamic_hw and rect.backend.rect_inputs
    assert rect.input_hw((1920, 1080)) == (384, 640)
    assert detectors["square"].input_hw((1920, 1080)) == (640, 640)
    head = rect.backend.infer(np.zeros((1, 3, 384, 640), np.float32))
    assert head.shape[2] == (384 // 8) * (640 // 8) + (384 // 16) * (640 // 16) + 12 * 20
    for bad in [(1, 3, 384, 650), (1, 3, 672, 640), (1, 3, 0, 640)]:
        with pytest.raises(ValueError, match="multiples of 32"):
            rect.backend.infer(np.zeros(bad, np.float32))


def test_rectangular_and_square_inputs_give_the_same_boxes_on_real_frames(
    detectors: dict[str, Detector], frames: list[np.ndarray]
) -> None:
    # Tolerances: the network sees the same pixels at the same scale, only less padding, so
    # the boxes agree closely but not bit for bit (convolutions near the padding differ).
    compared = 0
    for frame in frames:
        ((rect, _),) = detectors["rect"].detect([frame])
        ((square, _),) = detectors["square"].detect([frame])
        assert abs(len(rect.scores) - len(square.scores)) <= 1
        if len(rect.scores) == 0:
            continue
        iou = box_iou(rect.xyxy, square.xyxy)
        best = iou.argmax(axis=1)
        confident = rect.scores >= 0.4
        assert (iou.max(axis=1)[confident] >= 0.9).all()
        assert (rect.class_ids[confident] == square.class_ids[best][confident]).all()
        assert np.abs(rect.scores[confident] - square.scores[best][confident]).max() <= 0.05
        compared += int(confident.sum())
    assert compared >= 10


def test_frames_of_different_sizes_in_one_call_come_back_in_order(
    detectors: dict[str, Detector], frames: list[np.ndarray]
) -> None:
    big, small = frames[0], np.ascontiguousarray(frames[0][::2, ::2])
    portrait = np.ascontiguousarray(frames[1].transpose(1, 0, 2))
    batch = detectors["rect"].detect([big, portrait, small, big])
    alone = [detectors["rect"].detect([image])[0][0] for image in (big, portrait, small, big)]
    for (together, _), single in zip(batch, alone, strict=True):
        assert len(together.scores) == len(single.scores)
        np.testing.assert_allclose(together.xyxy, single.xyxy, atol=1e-3)


def test_the_shapes_benchmark_times_both_shapes_on_the_same_frames() -> None:
    from vdet.bench.pipeline import run_pipeline_shapes_bench

    report = run_pipeline_shapes_bench(
        asset_path("demo.onnx"), "onnxruntime", str(asset_path("sample.mp4")), frames=3, warmup=1
    )
    assert report["input_hw_used"] == {"square": [640, 640], "rect": [384, 640]}
    assert report["frames"] == 3
    latency: Any = report["latency_ms"]
    assert latency["rect"]["inference"]["p50"] > 0 and latency["square"]["total"]["p50"] > 0
    assert isinstance(report["rect_over_square_inference_time_p50"], float)
