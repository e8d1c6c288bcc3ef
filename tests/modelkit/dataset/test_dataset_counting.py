"""Ground truth for tracking: identities in synthetic clips, and the counting clip's answer."""

from __future__ import annotations

import itertools
from pathlib import Path

from vdet.config.tracking import ZoneSpec
from vdet.modelkit.dataset.counting import (
    LINE_X,
    counting_zones,
    expected_counts,
    iter_counting_video,
)
from vdet.modelkit.dataset.synthetic import Annotation, SceneConfig, VideoFrameTruth, iter_video


def test_video_truth_keeps_each_objects_identity() -> None:
    config = SceneConfig(width=320, height=240, min_size=16, max_size=60, min_objects=4)
    frames = list(iter_video(3, 5, config=config))
    ids = [[a.track_id for a in truth.annotations] for _, truth in frames]
    assert ids[0] == list(range(1, len(ids[0]) + 1))
    assert all(i == ids[0] for i in ids)  # every object stays in frame: same ids, same order
    # the same object: its box moves a little from one frame to the next
    a0, a1 = frames[0][1].annotations[0], frames[1][1].annotations[0]
    assert a0.class_id == a1.class_id and abs(a0.xyxy[0] - a1.xyxy[0]) <= 12


def truth(*frames: list[tuple[int, float, float]]) -> list[VideoFrameTruth]:
    """Frames of (track id, cx, cy) -> truth with 20 px red circles."""
    return [
        VideoFrameTruth(
            i,
            i / 30,
            tuple(
                Annotation(
                    0, (round(cx) - 10, round(cy) - 10, round(cx) + 10, round(cy) + 10), 1.0, t
                )
                for t, cx, cy in objects
            ),
        )
        for i, objects in enumerate(frames)
    ]


def test_expected_counts_follow_the_rules() -> None:
    frames = truth(
        [(1, LINE_X + 30, 300), (2, LINE_X - 30, 300), (3, LINE_X + 30, 900), (4, 1400, 500)],
        [(1, LINE_X, 300), (2, LINE_X - 20, 300), (3, LINE_X - 30, 900), (4, 1500, 500)],
        [(1, LINE_X - 30, 300), (2, LINE_X + 20, 300), (3, LINE_X - 40, 900), (4, 1800, 500)],
    )
    crossings, entries = expected_counts(frames)
    # 1 crosses right to left by way of the line ("in"), 2 left to right ("out"), 3 passes
    # beyond the line's end; 4 starts in the zone and leaves it: one entry.
    assert crossings == {("gate", "red_circle", "in"): 1, ("gate", "red_circle", "out"): 1}
    assert entries == {("pen", "red_circle"): 1}


def test_counting_zones_are_valid_specs() -> None:
    zones = [ZoneSpec.model_validate(z) for z in counting_zones()]
    assert [(z.id, z.kind) for z in zones] == [("gate", "line"), ("pen", "polygon")]


def test_counting_clip_objects_keep_their_lanes() -> None:
    frames = [t for _, t in itertools.islice(iter_counting_video(0, num_frames=60), 2)]
    assert len(frames[0].annotations) == 8
    for a, b in zip(frames[0].annotations, frames[1].annotations, strict=True):
        assert a.track_id == b.track_id and a.xyxy[1] == b.xyxy[1]


def test_counting_clip_file_carries_zones_and_answer(tmp_path: Path) -> None:
    import json

    from vdet.ingest.reader import SourceReader
    from vdet.modelkit.dataset.writers import write_counting_clip

    truth_path = write_counting_clip(tmp_path / "count.mp4", seed=0, seconds=0.3)
    record = json.loads(truth_path.read_text())
    assert [z["id"] for z in record["zones"]] == ["gate", "pen"]
    assert set(record["expected"]) == {"line_cross", "zone_enter"}
    assert len(record["frames"]) == 9 and record["frames"][0]["objects"][0]["track_id"] == 1
    with SourceReader(str(tmp_path / "count.mp4")) as reader:
        info = reader.open()
    assert (info.width, info.height) == (1920, 1080)
