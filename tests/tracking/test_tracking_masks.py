"""Masks: which detections a stream's `kind: mask` zones drop, and what they are as specs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from vdet.config.tracking import ZoneSpec
from vdet.core.types import Detections
from vdet.tracking.masks import anchor_points, drop_masked, without_masks
from vdet.tracking.zones import Zone, resolve_zones

SIZE_WH = (200, 100)


def detections(*rows: tuple[float, float, float, float, int]) -> Detections:
    boxes = np.asarray([r[:4] for r in rows], np.float32).reshape(-1, 4)
    return Detections(
        boxes,
        np.linspace(0.9, 0.5, len(rows)).astype(np.float32),
        np.asarray([r[4] for r in rows], np.int32),
    )


def mask(points: list[list[float]], **fields: Any) -> Zone:
    spec = ZoneSpec.model_validate({"id": "m", "kind": "mask", "points": points, **fields})
    (zone,) = resolve_zones([spec], lambda c: None if c is None else frozenset(int(i) for i in c))
    return zone


LEFT_HALF = [[0, 0], [0.5, 0], [0.5, 1], [0, 1]]  # normalised: x 0..100 px of 200
# Three boxes: centers (20, 50) class 0, (150, 50) class 1, and (100, 30) class 2 whose bottom
# center is (100, 90): on the mask's right edge.
BOXES = detections((10, 40, 30, 60, 0), (140, 40, 160, 60, 1), (90, -30, 110, 90, 2))


@pytest.mark.parametrize(
    ("masks", "kept"),
    [
        ((), [0, 1, 2]),
        ((mask(LEFT_HALF),), [1]),  # (100, 30) is on the edge: inside
        ((mask(LEFT_HALF, classes=[1, 2]),), [0, 1]),
        ((mask(LEFT_HALF, anchor="bottom_center"),), [1]),
        ((mask([[120, 0], [200, 0], [200, 100], [120, 100]], normalized=False),), [0, 2]),
        ((mask(LEFT_HALF, classes=[0]), mask([[0.6, 0], [1, 0], [1, 1], [0.6, 1]])), [2]),
        ((mask([[0.9, 0.9], [1, 0.9], [1, 1]]),), [0, 1, 2]),
    ],
)
def test_detections_whose_anchor_a_mask_covers_are_dropped(
    masks: tuple[Zone, ...], kept: list[int]
) -> None:
    got = drop_masked(BOXES, SIZE_WH, masks)
    expected = BOXES.select(np.asarray(kept, np.intp))
    np.testing.assert_array_equal(got.xyxy, expected.xyxy)
    np.testing.assert_array_equal(got.class_ids, expected.class_ids)
    np.testing.assert_array_equal(got.scores, expected.scores)


def test_nothing_dropped_gives_the_same_object_and_empty_stays_empty() -> None:
    far = (mask([[0.9, 0.9], [1, 0.9], [1, 1]]),)
    assert drop_masked(BOXES, SIZE_WH, far) is BOXES
    empty = Detections.empty()
    assert drop_masked(empty, SIZE_WH, (mask(LEFT_HALF),)) is empty
    assert len(drop_masked(BOXES, SIZE_WH, (mask([[0, 0], [1, 0], [1, 1], [0, 1]]),))) == 0


def test_anchor_points_are_the_center_or_the_bottom_center() -> None:
    xyxy = np.asarray([[10, 20, 30, 60]], np.float32)
    assert anchor_points(xyxy, "center").tolist() == [[20, 40]]
    assert anchor_points(xyxy, "bottom_center").tolist() == [[20, 60]]
    assert anchor_points(np.zeros((0, 4), np.float32), "center").shape == (0, 2)


def test_masks_are_split_from_the_zones_in_order() -> None:
    line = resolve_zones([ZoneSpec(id="l", kind="line", points=[(0, 0), (1, 1)])], lambda c: None)[
        0
    ]
    a, b = mask(LEFT_HALF), mask([[0.6, 0], [1, 0], [1, 1]])
    assert without_masks((a, line, b)) == ((a, b), (line,))
    assert without_masks((line,)) == ((), (line,))


@pytest.mark.parametrize(
    ("points", "message"),
    [
        ([[0, 0], [1, 1]], "at least 3 points"),
        ([[0, 0], [1, 1], [1, 0], [0, 1]], "crosses itself"),
        ([[0, 0], [0.5, 0.5], [1, 1]], "crosses itself|no area"),
        ([[0, 0], [1.5, 0], [1, 1]], "outside"),
    ],
)
def test_a_mask_is_checked_as_a_polygon(points: list[list[float]], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ZoneSpec.model_validate({"id": "m", "kind": "mask", "points": points})
