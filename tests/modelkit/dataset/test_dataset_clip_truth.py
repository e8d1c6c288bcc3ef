"""Recall against a clip's exact truth (vdet.modelkit.dataset.clip_truth), on the bundled
sample's."""

from __future__ import annotations

from typing import Any

import numpy as np

from vdet.core.assets import sample_clip
from vdet.core.types import Detections
from vdet.modelkit.dataset.clip_truth import (
    as_dicts,
    best_aligned_frame,
    countable,
    hits,
    iou,
    recall,
    sample_truth,
)


def _truth_as_detections(index: int) -> list[dict[str, Any]]:
    objects = sample_truth()["frames"][index]["objects"]
    return [{"class_id": o["class_id"], "box": o["box"]} for o in objects]


def test_the_sample_clip_and_its_truth_are_bundled() -> None:
    assert sample_clip().is_file() and sample_clip().suffix == ".mp4"
    truth = sample_truth()
    assert len(truth["frames"]) == 300 and truth["frames"][0]["objects"]
    assert sample_truth() is truth  # read once


def test_iou_and_what_counts() -> None:
    assert iou([0, 0, 10, 10], [0, 0, 10, 10]) == 1.0
    assert iou([0, 0, 10, 10], [5, 0, 15, 10]) == 50 / 150
    assert iou([0, 0, 10, 10], [20, 20, 30, 30]) == 0.0
    assert iou([0, 0, 0, 0], [0, 0, 0, 0]) == 0.0  # no area, no division by zero
    assert countable({"box": [0, 0, 24, 5], "visible_fraction": 0.5})
    assert not countable({"box": [0, 0, 23, 23], "visible_fraction": 1.0})
    assert not countable({"box": [0, 0, 100, 100], "visible_fraction": 0.49})


def test_the_truth_itself_scores_full_recall_and_nothing_scores_none() -> None:
    frames = [(i, _truth_as_detections(i)) for i in range(0, 300, 30)]
    assert recall(frames) == 1.0
    assert recall([(i, []) for i in range(0, 300, 30)]) == 0.0
    found, total = hits(300 + 5, _truth_as_detections(5))  # a looped clip's frame 305 is 5
    assert found == total > 0
    wrong_class = [dict(d, class_id=d["class_id"] + 1) for d in _truth_as_detections(5)]
    assert hits(5, wrong_class)[0] == 0
    # Slow objects match their neighbouring frames too: the first full match wins.
    aligned = best_aligned_frame(_truth_as_detections(123))
    found, total = hits(aligned, _truth_as_detections(123))
    assert abs(aligned - 123) <= 2 and found == total


def test_a_truth_of_ones_own_and_detections_as_dicts() -> None:
    truth = {
        "frames": [{"objects": [{"class_id": 1, "box": [0, 0, 50, 50], "visible_fraction": 1}]}]
    }
    detections = Detections(
        np.array([[0, 0, 50, 50], [0, 0, 49, 50]], np.float32),
        np.array([0.9, 0.1], np.float32),
        np.array([1, 1], np.int32),
    )
    assert as_dicts(detections, 0.5) == [{"class_id": 1, "box": [0.0, 0.0, 50.0, 50.0]}]
    assert recall([(0, as_dicts(detections, 0.5))], truth) == 1.0
    assert recall([(0, [])], truth) == 0.0
