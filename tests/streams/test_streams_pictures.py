"""`encode_frame`: the draw / scale / encode step every frame leaving the pipeline goes through."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from vdet.core.types import Detections
from vdet.streams.pictures import encode_frame


def _frame(width: int, height: int) -> np.ndarray:
    # A smooth gradient: compresses well and shows drawn boxes as outliers.
    x = np.linspace(0, 255, width, dtype=np.float32)[None, :, None]
    y = np.linspace(0, 255, height, dtype=np.float32)[:, None, None]
    return np.broadcast_to((x + y) / 2, (height, width, 3)).astype(np.uint8).copy()


def _decode(jpeg: bytes) -> np.ndarray:
    image = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
    assert image is not None
    return image


@pytest.mark.parametrize(
    ("size_wh", "max_width", "expected_wh"),
    [
        ((1920, 1080), 960, (960, 540)),
        ((1920, 1080), None, (1920, 1080)),
        ((640, 360), 960, (640, 360)),  # never scaled up
        ((641, 361), 320, (320, 180)),  # height rounded
        ((100, 1), 50, (50, 1)),  # never below one row
    ],
)
def test_scaled_down_to_max_width_only(
    size_wh: tuple[int, int], max_width: int | None, expected_wh: tuple[int, int]
) -> None:
    jpeg, wh = encode_frame(_frame(*size_wh), None, (), max_width=max_width)
    assert wh == expected_wh
    assert _decode(jpeg).shape == (expected_wh[1], expected_wh[0], 3)


@pytest.mark.parametrize("count", [0, 1])
def test_boxes_drawn_only_when_given(count: int) -> None:
    image = _frame(320, 240)
    boxes = Detections(
        xyxy=np.array([[40.0, 40.0, 200.0, 200.0]] * count, np.float32).reshape(count, 4),
        scores=np.array([0.9] * count, np.float32),
        class_ids=np.array([0] * count, np.int64),
    )
    plain, _ = encode_frame(image, None, ("person",), quality=95)
    drawn, _ = encode_frame(image, boxes, ("person",), quality=95)
    difference = np.abs(_decode(plain).astype(int) - _decode(drawn).astype(int))
    assert bool(difference[60:180, 40].mean() > 20) is (count == 1)  # the box's left edge
    assert difference[220:, 260:].mean() < 3  # far from any box
