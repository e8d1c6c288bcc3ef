"""`vdet eval --track` scoring: py-motmetrics fed with the service's tracks against exact truth."""

from __future__ import annotations

import numpy as np
import pytest

from vdet.core.types import Detections
from vdet.modelkit.dataset.synthetic import Annotation, VideoFrameTruth

mm = pytest.importorskip("motmetrics")

from vdet.modelkit.tracking_evaluation import _accumulate  # noqa: E402


def frame(index: int, *objects: tuple[int, int, float]) -> VideoFrameTruth:
    """(track id, x, visible fraction) -> truth of 40 px objects in a row."""
    return VideoFrameTruth(
        index,
        index / 30,
        tuple(Annotation(0, (x, 100, x + 40, 140), vis, t) for t, x, vis in objects),
    )


def tracks(*objects: tuple[int, float]) -> Detections:
    n = len(objects)
    return Detections(
        xyxy=np.asarray([[x, 100, x + 40, 140] for _, x in objects], np.float32).reshape(n, 4),
        scores=np.full(n, 0.9, np.float32),
        class_ids=np.zeros(n, np.int32),
        tracker_id=np.asarray([t for t, _ in objects], np.int32),
    )


def score(acc: object) -> dict[str, float]:
    row = (
        mm.metrics.create()
        .compute(acc, metrics=["idf1", "mota", "num_switches", "num_false_positives"])
        .iloc[0]
    )
    return {k: float(row[k]) for k in row.index}


def test_perfect_tracks_score_one() -> None:
    acc = mm.MOTAccumulator(auto_id=True)
    for i in range(5):
        _accumulate(acc, frame(i, (1, 10 * i, 1.0), (2, 300, 1.0)), tracks((7, 10 * i), (9, 300)))
    assert score(acc) == {
        "idf1": 1.0,
        "mota": 1.0,
        "num_switches": 0.0,
        "num_false_positives": 0.0,
    }


def test_an_id_switch_is_counted() -> None:
    acc = mm.MOTAccumulator(auto_id=True)
    for i in range(4):
        _accumulate(acc, frame(i, (1, 100, 1.0)), tracks((5 if i < 2 else 6, 100)))
    s = score(acc)
    assert s["num_switches"] == 1.0 and s["idf1"] == 0.5


def test_a_track_on_a_hidden_object_is_dont_care() -> None:
    acc = mm.MOTAccumulator(auto_id=True)
    _accumulate(acc, frame(0, (1, 100, 0.2)), tracks((5, 100)))  # mostly hidden: not scored
    _accumulate(acc, frame(1, (1, 100, 0.2)), Detections.empty())  # and not a miss either
    _accumulate(acc, frame(2, (1, 100, 0.2), (2, 300, 1.0)), tracks((5, 100), (6, 300)))
    s = score(acc)
    assert s["num_false_positives"] == 0.0 and s["mota"] == 1.0
