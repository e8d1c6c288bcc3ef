"""The compiled tracker and zone monitor against the NumPy ones they replaced, frame by frame:
the same track ids, started and ended tracks, events and occupancy on the benchmark's scenes
(objects crossing, misses, false positives, ambiguous frames that need the optimal
assignment), with polygons and lines of every option."""

from __future__ import annotations

from dataclasses import replace

import pytest

from vdet.bench.tracking import FRAME_WH, synthetic_detections
from vdet.bench.tracking_reference import ReferenceByteTracker, ReferenceZoneMonitor
from vdet.config.tracking import ZoneSpec
from vdet.tracking.bytetrack import ByteTracker, TrackerParams
from vdet.tracking.zones import ZoneMonitor, resolve_zones

ZONES = resolve_zones(
    [
        ZoneSpec(id="pen", kind="polygon", points=[(0.1, 0.1), (0.5, 0.1), (0.5, 0.9), (0.1, 0.9)]),
        ZoneSpec(
            id="u",
            kind="polygon",
            points=[
                (0.3, 0.3),
                (0.4, 0.3),
                (0.4, 0.6),
                (0.6, 0.6),
                (0.6, 0.3),
                (0.7, 0.3),
                (0.7, 0.8),
                (0.3, 0.8),
            ],
            anchor="bottom_center",
            classes=[1, 2, 3],
        ),
        ZoneSpec(id="gate", kind="line", points=[(0.7, 0.0), (0.7, 1.0)]),
        ZoneSpec(
            id="diag",
            kind="line",
            points=[(0.1, 0.9), (0.9, 0.2)],
            classes=[0, 4],
            anchor="bottom_center",
        ),
    ],
    lambda refs: None if refs is None else frozenset(int(r) for r in refs),
)


@pytest.mark.parametrize(
    ("objects", "frames", "params"),
    [
        (5, 150, TrackerParams()),
        (30, 200, TrackerParams()),
        (30, 150, TrackerParams(min_hits=3, class_aware=False, lost_track_buffer=5)),
        (100, 60, TrackerParams(match_iou=0.1)),
    ],
)
def test_compiled_tracking_matches_the_numpy_reference(
    objects: int, frames: int, params: TrackerParams
) -> None:
    tracker, reference = ByteTracker(params), ReferenceByteTracker(params)
    monitor, reference_monitor = ZoneMonitor(), ReferenceZoneMonitor()
    monitor.set_zones(ZONES)
    reference_monitor.set_zones(ZONES)
    events = 0
    for i, dets in enumerate(synthetic_detections(objects, frames, seed=objects)):
        got, want = tracker.update(dets), reference.update(dets)
        assert got.tracker_id.tolist() == want.tracker_id.tolist(), f"frame {i}"
        assert (got.started_classes, got.ended_ids) == (want.started_classes, want.ended_ids)
        assert len(tracker) == len(reference)
        zones_got = monitor.update(
            replace(dets, tracker_id=got.tracker_id), FRAME_WH, i / 30, got.ended_ids
        )
        zones_want = reference_monitor.update(
            replace(dets, tracker_id=want.tracker_id), FRAME_WH, i / 30, want.ended_ids
        )
        assert zones_got == zones_want, f"frame {i}"
        events += len(zones_got[0])
    assert events > 0
