"""Detector end to end on a tiny graph with a fixed head, and optionally on a real YOLOv8n."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from vdet.core.assets import assets_dir
from vdet.core.types import StageTimings
from vdet.inference.detector import Detector, InputShape
from vdet.inference.postprocess import PostprocessParams
from vdet.inference.preprocess import letterbox_batch

HeadModelWriter = Callable[..., Path]  # the conftest fixture
YoloExporter = Callable[[int | tuple[int, int], bool], tuple[object, Path]]  # conftest

INPUT_HW = (64, 96)


@pytest.fixture
def detector(write_head_model: HeadModelWriter) -> Detector:
    """Two anchors in a 64x96 input: a 'car' at x 10..50, y 20..40 (0.9), a faint 'person'."""
    head = np.zeros((6, 2), np.float32)
    head[:4, 0] = [30, 30, 40, 20]
    head[5, 0] = 0.9
    head[:4, 1] = [70, 40, 10, 10]
    head[4, 1] = 0.3
    path = write_head_model(
        nc=2,
        num_anchors=2,
        batch="batch",
        input_hw=INPUT_HW,
        head=head,
        output_shape=["batch", 6, 2],
        metadata={"names": "{0: 'person', 1: 'car'}"},
    )
    return Detector.open(path, backend="onnxruntime", threads=1)


@pytest.mark.parametrize(
    ("sizes_hw", "expected_car_boxes"),
    [
        ([], []),
        ([(64, 96)], [[10, 20, 50, 40]]),
        # 128x192: gain 0.5 exactly, no padding
        ([(64, 96), (128, 192)], [[10, 20, 50, 40], [20, 40, 100, 80]]),
        # 32x96 -> gain 1, pad_y 16: y 20..40 becomes 4..24
        ([(32, 96)], [[10, 4, 50, 24]]),
    ],
)
def test_detect_maps_boxes_to_each_source(
    detector: Detector, sizes_hw: list[tuple[int, int]], expected_car_boxes: list[list[float]]
) -> None:
    frames = [np.zeros((h, w, 3), np.uint8) for h, w in sizes_hw]
    with detector:
        results = detector.detect(frames)
    assert len(results) == len(frames)
    for (dets, timings), expected in zip(results, expected_car_boxes, strict=True):
        assert dets.class_ids.tolist() == [1, 0]
        np.testing.assert_allclose(dets.xyxy[0], expected, rtol=1e-6)
        np.testing.assert_allclose(dets.scores, [0.9, 0.3], rtol=1e-6)
        assert isinstance(timings, StageTimings)
        assert timings.preprocess > 0
        assert timings.inference > 0
        assert timings.postprocess > 0
        assert timings.decode == 0  # decode belongs to ingest, not to the detector


def test_params_override_per_call(detector: Detector) -> None:
    frame = np.zeros((64, 96, 3), np.uint8)
    assert len(detector.detect([frame])[0][0]) == 2
    ((dets, _),) = detector.detect([frame], PostprocessParams(conf_threshold=0.5))
    assert dets.class_ids.tolist() == [1]
    ((dets, _),) = detector.detect([frame], PostprocessParams(classes=frozenset({0})))
    assert dets.class_ids.tolist() == [0]


def test_default_params_come_from_the_constructor(detector: Detector) -> None:
    strict = Detector(detector.backend, PostprocessParams(conf_threshold=0.5))
    ((dets, _),) = strict.detect([np.zeros((64, 96, 3), np.uint8)])
    assert len(dets) == 1
    assert strict.info.names == ("person", "car")


def test_detect_rejects_non_bgr_images(detector: Detector) -> None:
    with pytest.raises(ValueError, match="HxWx3 uint8"):
        detector.detect([np.zeros((64, 96), np.uint8)])


@pytest.mark.slow
@pytest.mark.train
def test_raw_head_matches_torch(yolov8n_export: YoloExporter) -> None:
    torch = pytest.importorskip("torch")
    model, path = yolov8n_export(320, False)
    frames = [np.random.default_rng(i).integers(0, 256, (240, 320, 3), np.uint8) for i in range(3)]
    with Detector.open(path, backend="onnxruntime", threads=2) as detector:
        assert detector.backend.max_batch == 1  # static export: the backend splits the batch
        batch, _ = letterbox_batch(frames, detector.info.input_hw)
        raw = detector.backend.infer(batch)
    torch_model = model.model.eval()  # type: ignore[attr-defined]
    with torch.no_grad():
        reference = torch_model(torch.from_numpy(batch))[0].numpy()
    np.testing.assert_allclose(raw, reference, rtol=1e-3, atol=1e-3)


ASSETS = assets_dir()


@pytest.mark.slow
@pytest.mark.train
@pytest.mark.parametrize("input_shape", ["rect", "square"])
def test_demo_model_matches_ultralytics_predict(input_shape: InputShape) -> None:
    """The trained demo model on sample frames: same boxes, scores and classes as Ultralytics,
    with rectangular inputs (Ultralytics' default for dynamic ONNX models) and square ones."""
    model_path, clip_path = ASSETS / "demo.onnx", ASSETS / "sample.mp4"
    if not (model_path.is_file() and clip_path.is_file()):
        pytest.skip("service/vdet/assets/demo.onnx and sample.mp4 are not present")
    ultralytics = pytest.importorskip("ultralytics")
    av = pytest.importorskip("av")
    with av.open(str(clip_path)) as container:
        frames = [
            frame.to_ndarray(format="bgr24")
            for i, frame in zip(range(30), container.decode(video=0), strict=False)
            if i % 10 == 0
        ]
    with Detector.open(
        model_path, backend="onnxruntime", input_shape=input_shape, threads=2
    ) as detector:
        results = detector.detect(frames)
        input_hw = detector.info.input_hw
    reference_model = ultralytics.YOLO(str(model_path), task="detect")
    total = 0
    for frame, (dets, _) in zip(frames, results, strict=True):
        # rect: Ultralytics letterboxes dynamic ONNX models to the smallest stride-multiple
        # rectangle, as vdet's "rect" does; rect=False fills the model's full input size.
        (reference,) = reference_model.predict(
            frame,
            imgsz=list(input_hw),
            conf=0.25,
            iou=0.45,
            rect=input_shape == "rect",
            verbose=False,
        )
        boxes = reference.boxes
        assert dets.class_ids.tolist() == boxes.cls.numpy().astype(int).tolist()
        np.testing.assert_allclose(dets.xyxy, boxes.xyxy.numpy(), atol=1e-3)
        np.testing.assert_allclose(dets.scores, boxes.conf.numpy(), atol=1e-6)
        total += len(dets)
    assert total > 0
