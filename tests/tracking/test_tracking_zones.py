"""Zone geometry edge cases, zone validation, and the events tracks make with zones."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from vdet.config.tracking import MAX_ZONES, TrackingSpec, ZoneSpec
from vdet.core.geometry import points_in_polygon, self_intersection, side_of_line
from vdet.core.types import Detections
from vdet.tracking.bytetrack import TrackerParams
from vdet.tracking.zones import ZoneMonitor, check_in_frame, resolve_zones

SQUARE = [[10.0, 10.0], [20.0, 10.0], [20.0, 20.0], [10.0, 20.0]]
# A "U": the notch x 13..17, y 10..17 is outside.
U_SHAPE = [[10, 10], [13, 10], [13, 17], [17, 17], [17, 10], [20, 10], [20, 20], [10, 20]]


@pytest.mark.parametrize(
    ("point", "inside"),
    [
        ((15, 15), True),
        ((10, 15), True),  # on the left edge
        ((10, 10), True),  # a vertex
        ((20, 20), True),  # the opposite vertex
        ((15, 20), True),  # on the bottom edge
        ((9.999, 15), False),
        ((25, 15), False),
        ((15, 5), False),
    ],
)
def test_point_in_square_boundary_counts_as_inside(
    point: tuple[float, float], inside: bool
) -> None:
    got = points_in_polygon(np.asarray([point], np.float64), np.asarray(SQUARE))
    assert got.tolist() == [inside]


@pytest.mark.parametrize(
    ("point", "inside"),
    [
        ((11, 12), True),  # left arm
        ((19, 12), True),  # right arm
        ((15, 12), False),  # the notch of a concave polygon
        ((15, 17), True),  # on the notch's floor
        ((15, 19), True),  # the base
        ((13, 12), True),  # on the notch's wall
    ],
)
def test_point_in_concave_polygon(point: tuple[float, float], inside: bool) -> None:
    got = points_in_polygon(np.asarray([point], np.float64), np.asarray(U_SHAPE, np.float64))
    assert got.tolist() == [inside]


def test_points_in_polygon_empty() -> None:
    assert points_in_polygon(np.zeros((0, 2)), np.asarray(SQUARE)).shape == (0,)


def test_side_of_line_on_the_image() -> None:
    a, b = np.asarray([0.0, 10.0]), np.asarray([100.0, 10.0])  # drawn left to right
    pts = np.asarray([[50, 20], [50, 0], [50, 10], [200, 10]], np.float64)
    assert side_of_line(pts, a, b).tolist() == [1, -1, 0, 0]  # below: right-hand side


@pytest.mark.parametrize(
    ("polygon", "expected"),
    [
        (SQUARE, None),
        (U_SHAPE, None),
        ([[0, 0], [10, 10], [10, 0], [0, 10]], (0, 2)),  # a bow tie
        ([[0, 0], [10, 0], [5, 0], [5, 5]], (0, 2)),  # folds back onto edge 0
        ([[0, 0], [10, 0], [10, 10], [5, 0], [0, 10]], (0, 2)),  # a vertex touches an edge
    ],
)
def test_self_intersection(polygon: list[list[float]], expected: tuple[int, int] | None) -> None:
    assert self_intersection(polygon) == expected


def zone(**fields: Any) -> ZoneSpec:
    return ZoneSpec.model_validate({"id": "z", "kind": "polygon", **fields})


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"points": [[0, 0], [1, 1], [1, 0], [0, 1]]}, "crosses itself"),
        ({"points": [[0, 0], [1e-5, 0], [0, 1e-5]]}, "no area"),
        ({"points": [[0, 0], [0.5, 0.5], [1, 1]]}, "crosses itself"),  # folds back
        ({"points": [[0, 0], [1, 0]]}, "at least 3 points"),
        ({"points": [[0, 0], [1.5, 0], [1, 1]]}, "outside the normalised"),
        ({"points": [[0, 0], [-1, 0], [1, 1]], "normalized": False}, "outside the pixel"),
        ({"kind": "line", "points": [[0, 0], [1, 0], [1, 1]]}, "exactly 2 points"),
        ({"kind": "line", "points": [[0.5, 0.5], [0.5, 0.5]]}, "must differ"),
        ({"points": [[0, 0]] * 65}, "at most 64"),
        ({"points": [[0, 0], [1, 0], [1, 1]], "colour": "red"}, "Extra inputs"),
        ({"points": [[0, 0], [1, 0], [1, float("nan")]]}, "finite"),
    ],
)
def test_invalid_zones_say_why(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        zone(**fields)


def test_zone_ids_are_unique_and_bounded() -> None:
    from pydantic import TypeAdapter

    from vdet.config.tracking import ZoneList

    adapter = TypeAdapter(ZoneList)
    line = {"kind": "line", "points": [[0, 0], [1, 1]]}
    with pytest.raises(ValidationError, match="more than once"):
        adapter.validate_python([{"id": "a", **line}, {"id": "a", **line}])
    with pytest.raises(ValidationError, match=f"at most {MAX_ZONES}"):
        adapter.validate_python([{"id": f"z{i}", **line} for i in range(MAX_ZONES + 1)])


def test_pixel_zones_must_fit_the_frame() -> None:
    spec = zone(points=[[0, 0], [2000, 0], [2000, 100]], normalized=False)
    check_in_frame([spec], (2560, 1440))
    with pytest.raises(ValueError, match="outside the stream's 1920x1080 frame"):
        check_in_frame([spec], (1920, 1080))


def test_unknown_zone_classes_name_the_zone() -> None:
    def resolve(classes: Any) -> frozenset[int] | None:
        raise ValueError("unknown class(es) 'cat'")

    with pytest.raises(ValueError, match="zone 'z': unknown class"):
        resolve_zones([zone(points=SQUARE, normalized=False, classes=["cat"])], resolve)


def test_tracking_spec_is_bounded() -> None:
    with pytest.raises(ValidationError):
        TrackingSpec(lost_track_buffer=-1)
    with pytest.raises(ValidationError):
        TrackingSpec.model_validate({"lost_buffer": 3})


# --- events -------------------------------------------------------------------------------


def tracked(*objects: tuple[int, int, float, float]) -> Detections:
    """(track id, class id, cx, cy) -> 10x10 boxes carrying those tracker ids."""
    n = len(objects)
    return Detections(
        xyxy=np.asarray(
            [[cx - 5, cy - 5, cx + 5, cy + 5] for _, _, cx, cy in objects], np.float32
        ).reshape(n, 4),
        scores=np.full(n, 0.9, np.float32),
        class_ids=np.asarray([c for _, c, _, _ in objects], np.int32),
        tracker_id=np.asarray([t for t, _, _, _ in objects], np.int32),
    )


def monitor(*specs: ZoneSpec) -> ZoneMonitor:
    m = ZoneMonitor()
    m.set_zones(resolve_zones(specs, lambda c: None if c is None else frozenset(map(int, c))))
    return m


SIZE = (100, 100)


def test_enter_exit_with_dwell_and_occupancy() -> None:
    m = monitor(zone(points=SQUARE, normalized=False))
    events, occupancy = m.update(tracked((1, 0, 5, 15)), SIZE, 0.0)
    assert events == () and occupancy == ()
    events, occupancy = m.update(tracked((1, 0, 12, 15)), SIZE, 1.0)
    assert [(e.type, e.track_id) for e in events] == [("zone_enter", 1)]
    assert [(o.zone, o.class_id, o.objects) for o in occupancy] == [("z", 0, 1)]
    m.update(tracked((1, 0, 18, 15)), SIZE, 3.5)
    events, occupancy = m.update(tracked((1, 0, 30, 15)), SIZE, 4.0)
    assert [(e.type, e.dwell_s) for e in events] == [("zone_exit", 2.5)]
    assert [(o.class_id, o.objects) for o in occupancy] == [(0, 0)]  # zero, not absent


def test_a_track_in_the_notch_of_a_concave_zone_is_outside() -> None:
    m = monitor(zone(points=U_SHAPE, normalized=False))
    assert m.update(tracked((1, 0, 15, 12)), SIZE, 0.0)[0] == ()
    events, _ = m.update(tracked((1, 0, 15, 18)), SIZE, 1.0)
    assert [e.type for e in events] == ["zone_enter"]


def test_an_unseen_track_stays_inside_until_the_tracker_ends_it() -> None:
    m = monitor(zone(points=SQUARE, normalized=False))
    m.update(tracked((7, 3, 15, 15)), SIZE, 0.0)
    m.update(tracked((7, 3, 15, 15)), SIZE, 2.0)
    events, occupancy = m.update(tracked(), SIZE, 3.0)  # occluded: still counted
    assert events == () and occupancy[0].objects == 1
    events, occupancy = m.update(tracked(), SIZE, 9.0, ended_ids=[7])
    assert [(e.type, e.track_id, e.class_id, e.dwell_s) for e in events] == [
        ("zone_exit", 7, 3, 2.0)
    ]
    assert occupancy[0].objects == 0


def test_class_filter() -> None:
    m = monitor(zone(points=SQUARE, normalized=False, classes=[1]))
    events, _ = m.update(tracked((1, 0, 15, 15), (2, 1, 12, 12)), SIZE, 0.0)
    assert [(e.track_id, e.class_id) for e in events] == [(2, 1)]


def test_normalised_zone_scales_with_the_frame() -> None:
    m = monitor(zone(points=[[0.5, 0], [1, 0], [1, 1], [0.5, 1]]))
    events, _ = m.update(tracked((1, 0, 60, 10), (2, 0, 40, 10)), SIZE, 0.0)
    assert [e.track_id for e in events] == [1]


def line(**fields: Any) -> ZoneSpec:
    return ZoneSpec.model_validate(
        {"id": "gate", "kind": "line", "normalized": False, "points": [[50, 0], [50, 50]], **fields}
    )


def test_line_crossing_both_directions() -> None:
    m = monitor(line())  # top to bottom: x < 50 is the right-hand side on the image
    assert m.update(tracked((1, 0, 60, 20)), SIZE, 0.0)[0] == ()
    events, occupancy = m.update(tracked((1, 0, 40, 22)), SIZE, 1.0)
    assert [(e.type, e.direction) for e in events] == [("line_cross", "in")]
    assert occupancy == ()  # lines have no occupancy
    events, _ = m.update(tracked((1, 0, 61, 22)), SIZE, 2.0)
    assert [(e.type, e.direction) for e in events] == [("line_cross", "out")]


def test_touching_the_line_or_jittering_on_it_is_not_a_crossing() -> None:
    m = monitor(line())
    xs = [40, 50, 50, 45, 50, 42]  # reaches the line, never goes past
    assert all(m.update(tracked((1, 0, x, 20)), SIZE, float(i))[0] == () for i, x in enumerate(xs))
    events, _ = m.update(tracked((1, 0, 55, 20)), SIZE, 9.0)  # now it does: counted once
    assert [e.direction for e in events] == ["out"]


def test_passing_beyond_the_end_of_the_line_is_not_a_crossing() -> None:
    m = monitor(line())
    m.update(tracked((1, 0, 40, 80)), SIZE, 0.0)  # below the segment's end (y 0..50)
    assert m.update(tracked((1, 0, 60, 80)), SIZE, 1.0)[0] == ()


def test_a_changed_zone_starts_afresh_and_a_kept_one_keeps_its_state() -> None:
    m = monitor(zone(points=SQUARE, normalized=False))
    m.update(tracked((1, 0, 15, 15)), SIZE, 0.0)
    resolve = lambda c: None  # noqa: E731
    m.set_zones(resolve_zones([zone(points=SQUARE, normalized=False)], resolve))
    assert m.update(tracked((1, 0, 15, 15)), SIZE, 1.0)[0] == ()  # same zone: no new enter
    moved = zone(points=[[11, 11], [20, 11], [20, 20], [11, 20]], normalized=False)
    m.set_zones(resolve_zones([moved], resolve))
    events, _ = m.update(tracked((1, 0, 15, 15)), SIZE, 2.0)
    assert [e.type for e in events] == ["zone_enter"]


def test_a_tracked_result_crosses_processes_as_plain_data() -> None:
    """Results travel from stream worker processes to the API pickled: everything tracking
    adds must survive that unchanged."""
    import pickle

    from vdet.config.tracking import TrackingSpec
    from vdet.core.types import DetectionResult, StageTimings
    from vdet.tracking.stream_tracking import StreamTracking

    zones = resolve_zones([zone(points=SQUARE, normalized=False)], lambda c: None)
    frame = StreamTracking().update(
        tracked((0, 2, 15, 15)), SIZE, 0.0, TrackerParams.of(TrackingSpec()), zones
    )
    result = DetectionResult(
        "cam", 0, None, 0.0, 0.0, SIZE, frame.detections, StageTimings(),
        events=frame.events, tracking=frame.summary,
    )  # fmt: skip
    back = pickle.loads(pickle.dumps(result))
    assert back.events == result.events and back.tracking == result.tracking
    assert back.detections.tracker_id is not None
    assert back.detections.tracker_id.tolist() == [1]
    assert [e.type for e in back.events] == ["zone_enter"]
