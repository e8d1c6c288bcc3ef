"""Per-class score thresholds: what `ClassThresholds.keep` drops, and that detecting at the
floor then keeping equals thresholding each class before NMS (on the CPU reference)."""

from __future__ import annotations

import numpy as np
import pytest

from vdet.core.contract import PostprocessParams
from vdet.core.types import Detections
from vdet.inference.class_thresholds import ClassThresholds, thresholds_by_class
from vdet.inference.postprocess import decode_and_nms

NAMES = ("person", "car", "dog")


def resolve(refs: object) -> frozenset[int] | None:
    out = set()
    for ref in refs:  # type: ignore[attr-defined]
        if isinstance(ref, str) and ref in NAMES:
            out.add(NAMES.index(ref))
        elif isinstance(ref, str) and ref.isdigit() and int(ref) < len(NAMES):
            out.add(int(ref))
        else:
            raise ValueError(f"unknown class {ref!r}")
    return frozenset(out)


def detections(scores: list[float], classes: list[int]) -> Detections:
    n = len(scores)
    return Detections(
        np.tile(np.asarray([[0, 0, 10, 10]], np.float32), (n, 1)),
        np.asarray(scores, np.float32),
        np.asarray(classes, np.int32),
    )


@pytest.mark.parametrize(
    ("by_class", "kept"),
    [
        ({0: 0.5}, [0, 2, 3]),  # person 0.6 and 0.4 (0.4 <= 0.5: out), car 0.3, dog 0.9
        ({1: 0.35}, [0, 1, 3]),
        ({0: 0.6}, [2, 3]),  # a score must exceed its threshold: 0.6 is out
        ({0: 0.1, 1: 0.1, 2: 0.95}, [0, 1, 2]),
    ],
)
def test_keep_drops_what_is_not_over_its_class_s_threshold(
    by_class: dict[int, float], kept: list[int]
) -> None:
    dets = detections([0.6, 0.4, 0.3, 0.9], [0, 0, 1, 2])
    thresholds = ClassThresholds.of(0.25, by_class)
    assert thresholds is not None
    got = thresholds.keep(dets)
    assert got.scores.tolist() == pytest.approx([dets.scores[i] for i in kept])


def test_nothing_per_class_is_none_and_all_passing_gives_the_same_object() -> None:
    assert ClassThresholds.of(0.25, {}) is None
    thresholds = ClassThresholds.of(0.25, {2: 0.5, 0: 0.1})
    assert thresholds is not None
    assert thresholds.floor == 0.1 and thresholds.by_class == ((0, 0.1), (2, 0.5))
    dets = detections([0.6, 0.3], [0, 1])
    assert thresholds.keep(dets) is dets
    empty = Detections.empty()
    assert thresholds.keep(empty) is empty
    assert ClassThresholds.of(0.25, {1: 0.5}).floor == 0.25  # type: ignore[union-attr]


def test_names_and_ids_resolve_and_unknown_names_are_refused() -> None:
    assert thresholds_by_class({"person": 0.5, "2": 0.7}, resolve) == {0: 0.5, 2: 0.7}
    assert thresholds_by_class(None, resolve) == {}
    with pytest.raises(ValueError, match="unicorn"):
        thresholds_by_class({"unicorn": 0.5}, resolve)


@pytest.mark.parametrize("seed", range(20))
def test_floor_then_keep_equals_each_class_thresholded_before_nms(seed: int) -> None:
    """The module's claim, on random heads: per-class NMS at the floor, then `keep`, gives
    exactly the boxes of NMS run with each class's own threshold."""
    rng = np.random.default_rng(seed)
    n, nc = 300, 3
    centers = rng.uniform(20, 300, (2, n))
    sizes = rng.uniform(10, 80, (2, n))
    scores = rng.uniform(0, 1, (nc, n)) ** 3
    raw = np.concatenate([centers, sizes, scores])[None].astype(np.float32)
    by_class = {0: float(rng.uniform(0.1, 0.6)), 2: float(rng.uniform(0.1, 0.6))}
    default = 0.3
    thresholds = ClassThresholds.of(default, by_class)
    assert thresholds is not None
    params = PostprocessParams(conf_threshold=thresholds.floor, iou_threshold=0.5)
    (at_floor,) = decode_and_nms(raw, params)
    got = thresholds.keep(at_floor)

    expected_rows = []
    for class_id in range(nc):
        own = PostprocessParams(
            conf_threshold=by_class.get(class_id, default),
            iou_threshold=0.5,
            classes=frozenset({class_id}),
        )
        (dets,) = decode_and_nms(raw, own)
        expected_rows += rows(dets)
    assert sorted(rows(got), reverse=True) == sorted(expected_rows, reverse=True)
    assert len(got) > 10  # the random heads leave something to compare


def rows(dets: Detections) -> list[tuple[float, tuple[float, ...]]]:
    return [(float(s), tuple(b)) for s, b in zip(dets.scores, dets.xyxy.tolist(), strict=True)]
