"""Scoring detections against a clip's exact per-frame truth, by default the bundled sample's.

The truth is the JSON `vdet.modelkit.dataset.writers.truth_to_json` writes beside a rendered clip
(`sample.json` beside `sample.mp4` in the package's assets): amodal xyxy boxes per frame, each
with its class and the fraction of it that is visible. This module reads it and scores
detections against it (class-aware recall at IoU 0.5 over the objects one can expect to see),
for the tests and the accuracy benchmarks alike; `cpu_path_detections` gives the CPU path's
detections of the sample clip, the reference the GPU path is held to. It must not decide what
a good score is: callers hold their own thresholds.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

from vdet.core.assets import assets_dir, sample_clip
from vdet.core.types import Detections
from vdet.inference.postprocess import PostprocessParams

Truth = Mapping[str, Any]


@functools.cache
def sample_truth() -> Truth:
    """The bundled sample clip's truth (read once)."""
    data: dict[str, Any] = json.loads((assets_dir() / "sample.json").read_text())
    return data


def iou(a: Sequence[float], b: Sequence[float]) -> float:
    """Intersection over union of two xyxy boxes (0 for boxes of no area)."""
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def countable(obj: Mapping[str, Any], min_size: int = 24, min_visible: float = 0.5) -> bool:
    """Objects of at least `min_size` px that are mostly visible.

    The truth boxes are amodal: an object almost hidden behind another cannot be expected.
    """
    x1, y1, x2, y2 = obj["box"]
    return bool(max(x2 - x1, y2 - y1) >= min_size and obj["visible_fraction"] >= min_visible)


def hits(
    truth_index: int, detections: Sequence[Mapping[str, Any]], truth: Truth | None = None
) -> tuple[int, int]:
    """(found, countable) objects of truth frame `truth_index` (modulo the clip's length: a
    looped clip's frames go on counting): same class, IoU >= 0.5."""
    frames = (sample_truth() if truth is None else truth)["frames"]
    found = total = 0
    for obj in frames[truth_index % len(frames)]["objects"]:
        if not countable(obj):
            continue
        total += 1
        found += any(
            d["class_id"] == obj["class_id"] and iou(d["box"], obj["box"]) >= 0.5
            for d in detections
        )
    return found, total


def recall(
    frames: Sequence[tuple[int, Sequence[Mapping[str, Any]]]], truth: Truth | None = None
) -> float:
    """Class-aware recall at IoU 0.5 over (truth frame index, detections) pairs."""
    found = total = 0
    for index, detections in frames:
        f, t = hits(index, detections, truth)
        found, total = found + f, total + t
    return found / total if total else 0.0


def best_aligned_frame(detections: Sequence[Mapping[str, Any]], truth: Truth | None = None) -> int:
    """The truth frame these detections match best: a live stream's frame 0 is not the clip's."""
    count = len((sample_truth() if truth is None else truth)["frames"])
    scores = [hits(i, detections, truth) for i in range(count)]
    return max(range(count), key=lambda i: scores[i][0] / max(scores[i][1], 1))


def as_dicts(detections: Detections, min_score: float = 0.0) -> list[dict[str, Any]]:
    """Detections as the {"class_id", "box"} dicts `hits` and `recall` score."""
    return [
        {"class_id": int(c), "box": [float(v) for v in b]}
        for b, s, c in zip(detections.xyxy, detections.scores, detections.class_ids, strict=True)
        if s >= min_score
    ]


def cpu_path_detections(params: PostprocessParams | None = None) -> dict[int, Detections]:
    """Every frame of the sample clip through the CPU path (FFmpeg decode, ONNX Runtime FP32 on
    the demo model), by frame index: the reference the GPU path is held to."""
    # Imported here: scoring needs only the JSON, and this is the one function that runs a model.
    from vdet.core.types import VideoFrame
    from vdet.inference.detector import Detector
    from vdet.ingest.reader import SourceReader

    out: dict[int, Detections] = {}
    with Detector.open(assets_dir() / "demo.onnx", "onnxruntime") as cpu:
        reader = SourceReader(str(sample_clip()), source_id="reference")
        with reader:
            reader.open()
            for item in reader.frames():
                if isinstance(item, VideoFrame):
                    ((d, _),) = cpu.detect([item.image_bgr], params or cpu.params)
                    out[item.index] = d
    return out
