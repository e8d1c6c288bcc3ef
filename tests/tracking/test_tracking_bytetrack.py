"""The tracker against hand-built trajectories: steady motion, occlusion, id-switch bait,
objects leaving and coming back, weak detections, confirmation."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from vdet.core.types import NO_TRACK, Detections
from vdet.tracking.bytetrack import ByteTracker, TrackerParams, box_iou


def dets(
    boxes: Sequence[Sequence[float]], scores: Sequence[float] | None = None, classes=None
) -> Detections:
    n = len(boxes)
    return Detections(
        xyxy=np.asarray(boxes, np.float32).reshape(n, 4),
        scores=np.asarray(scores if scores is not None else [0.9] * n, np.float32),
        class_ids=np.asarray(classes if classes is not None else [0] * n, np.int32),
    )


def box(cx: float, cy: float, size: float = 40.0) -> list[float]:
    h = size / 2
    return [cx - h, cy - h, cx + h, cy + h]


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ([[0, 0, 10, 10]], [[0, 0, 10, 10]], 1.0),
        ([[0, 0, 10, 10]], [[5, 0, 15, 10]], 1 / 3),
        ([[0, 0, 10, 10]], [[20, 20, 30, 30]], 0.0),
        ([[0, 0, 0, 0]], [[0, 0, 0, 0]], 0.0),
    ],
)
def test_box_iou(a: list[list[float]], b: list[list[float]], expected: float) -> None:
    got = box_iou(np.asarray(a, np.float32), np.asarray(b, np.float32))
    assert got.shape == (1, 1) and got[0, 0] == pytest.approx(expected, abs=1e-6)


def test_box_iou_empty() -> None:
    assert box_iou(np.zeros((0, 4), np.float32), np.zeros((3, 4), np.float32)).shape == (0, 3)


def test_empty_frames_are_fine() -> None:
    tracker = ByteTracker()
    update = tracker.update(Detections.empty())
    assert update.tracker_id.shape == (0,) and update.started_classes == ()


def test_two_objects_moving_keep_their_ids() -> None:
    tracker = ByteTracker()
    seen: list[list[int]] = []
    for t in range(30):
        update = tracker.update(dets([box(100 + 8 * t, 100), box(500 - 6 * t, 300)]))
        seen.append(update.tracker_id.tolist())
    assert seen[0] == [1, 2]
    assert all(ids == [1, 2] for ids in seen)


def test_ids_follow_objects_whatever_the_detection_order() -> None:
    tracker = ByteTracker()
    tracker.update(dets([box(100, 100), box(400, 100)]))
    update = tracker.update(dets([box(404, 100), box(104, 100)]))
    assert update.tracker_id.tolist() == [2, 1]


def test_occluded_object_resumes_its_id_within_the_buffer() -> None:
    tracker = ByteTracker(TrackerParams(lost_track_buffer=10))
    for t in range(10):
        tracker.update(dets([box(100 + 5 * t, 100)]))
    for _ in range(6):  # hidden for 6 frames while it keeps moving
        assert tracker.update(Detections.empty()).ended_ids == ()
    update = tracker.update(dets([box(100 + 5 * 16, 100)]))
    assert update.tracker_id.tolist() == [1] and update.started_classes == ()


def test_track_ends_after_the_buffer_and_a_return_is_a_new_track() -> None:
    tracker = ByteTracker(TrackerParams(lost_track_buffer=3))
    for _ in range(5):
        tracker.update(dets([box(100, 100)]))
    ended = [tracker.update(Detections.empty()).ended_ids for _ in range(4)]
    assert ended == [(), (), (), (1,)]
    assert len(tracker) == 0
    update = tracker.update(dets([box(100, 100)]))  # leaves and re-enters: a new identity
    assert update.tracker_id.tolist() == [2] and update.started_classes == (0,)


def test_crossing_objects_do_not_swap_ids() -> None:
    """Id-switch bait: two same-class objects pass each other; constant velocity carries each
    track through the overlap."""
    tracker = ByteTracker()
    ids_a, ids_b = [], []
    for t in range(40):
        a = box(100 + 10 * t, 200)
        b = box(490 - 10 * t, 210)
        update = tracker.update(dets([a, b]))
        ids_a.append(int(update.tracker_id[0]))
        ids_b.append(int(update.tracker_id[1]))
    assert set(ids_a) == {1} and set(ids_b) == {2}


def test_crossing_objects_hidden_while_they_overlap_keep_their_ids() -> None:
    tracker = ByteTracker()
    out = []
    for t in range(40):
        a, b = box(100 + 10 * t, 200), box(490 - 10 * t, 200)
        # while they overlap only the front one (b) is detected
        visible = [b] if abs((100 + 10 * t) - (490 - 10 * t)) < 40 else [a, b]
        update = tracker.update(dets(visible))
        out.append((len(visible), update.tracker_id.tolist()))
    assert all(ids == [1, 2] for n, ids in out if n == 2)
    assert all(ids == [2] for n, ids in out if n == 1)


def test_class_aware_matching_does_not_hand_a_track_to_another_class() -> None:
    tracker = ByteTracker()
    tracker.update(dets([box(100, 100)], classes=[0]))
    update = tracker.update(dets([box(102, 100)], classes=[1]))  # same place, other class
    assert update.tracker_id.tolist() == [2]
    tracker = ByteTracker(TrackerParams(class_aware=False))
    tracker.update(dets([box(100, 100)], classes=[0]))
    assert tracker.update(dets([box(102, 100)], classes=[1])).tracker_id.tolist() == [1]


def test_weak_detections_continue_tracks_but_start_none() -> None:
    tracker = ByteTracker()
    assert tracker.update(dets([box(100, 100)], [0.3])).tracker_id.tolist() == [NO_TRACK]
    assert len(tracker) == 0
    tracker.update(dets([box(100, 100)], [0.9]))
    # the score drops under track_threshold (partial occlusion): the track goes on
    assert tracker.update(dets([box(101, 100)], [0.3])).tracker_id.tolist() == [1]


def test_min_hits_delays_the_id_and_drops_one_frame_flickers() -> None:
    tracker = ByteTracker(TrackerParams(min_hits=3))
    first = [tracker.update(dets([box(100, 100)])).tracker_id.tolist() for _ in range(3)]
    assert first == [[NO_TRACK], [NO_TRACK], [1]]
    tracker.update(dets([box(100, 100), box(400, 400)]))  # a flicker at (400, 400)
    update = tracker.update(dets([box(100, 100), box(400, 400)]))
    assert update.tracker_id.tolist() == [1, NO_TRACK]
    tracker.update(dets([box(100, 100)]))
    tracker.update(dets([box(100, 100), box(400, 400)]))
    assert len(tracker) == 2  # the flicker's track died when it missed a frame and restarted


def test_started_classes_report_each_new_track_once() -> None:
    tracker = ByteTracker()
    two = dets([box(100, 100), box(300, 300)], classes=[2, 5])
    assert tracker.update(two).started_classes == (2, 5)
    assert tracker.update(two).started_classes == ()


def test_boxes_of_another_dtype_or_layout_track_the_same() -> None:
    """The compiled loops are built for C-ordered float32 boxes; others are converted."""
    frames = [dets([box(100 + 8 * t, 100), box(500 - 6 * t, 300)]) for t in range(5)]
    plain, other = ByteTracker(), ByteTracker()
    for frame in frames:
        wide = np.asfortranarray(frame.xyxy.astype(np.float64))
        odd = Detections(wide, frame.scores.astype(np.float64), frame.class_ids.astype(np.int64))
        assert other.update(odd).tracker_id.tolist() == plain.update(frame).tracker_id.tolist()
