"""Scoring detections against the sample clip's exact ground truth (`sample.json`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from vdet.cli import asset_path
from vdet.pipeline.postprocess import PostprocessParams
from vdet.types import Detections

SAMPLE = asset_path("sample.mp4")
TRUTH: dict[str, Any] = json.loads(asset_path("sample.json").read_text())


def iou(a: Sequence[float], b: Sequence[float]) -> float:
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def countable(obj: dict[str, Any], min_size: int = 24, min_visible: float = 0.5) -> bool:
    """Objects of at least `min_size` px that are mostly visible.

    The truth boxes are amodal: an object almost hidden behind another cannot be expected.
    """
    x1, y1, x2, y2 = obj["box"]
    return max(x2 - x1, y2 - y1) >= min_size and obj["visible_fraction"] >= min_visible


def hits(truth_index: int, detections: Sequence[dict[str, Any]]) -> tuple[int, int]:
    """(found, countable) objects of truth frame `truth_index`: same class, IoU >= 0.5."""
    found = total = 0
    for obj in TRUTH["frames"][truth_index % len(TRUTH["frames"])]["objects"]:
        if not countable(obj):
            continue
        total += 1
        found += any(
            d["class_id"] == obj["class_id"] and iou(d["box"], obj["box"]) >= 0.5
            for d in detections
        )
    return found, total


def recall(frames: Sequence[tuple[int, Sequence[dict[str, Any]]]]) -> float:
    """Class-aware recall at IoU 0.5 over (truth frame index, detections) pairs."""
    found = total = 0
    for index, detections in frames:
        f, t = hits(index, detections)
        found, total = found + f, total + t
    return found / total if total else 0.0


def best_aligned_frame(detections: Sequence[dict[str, Any]]) -> int:
    """The truth frame these detections match best: a live stream's frame 0 is not the clip's."""
    scores = [hits(i, detections) for i in range(len(TRUTH["frames"]))]
    return max(range(len(scores)), key=lambda i: scores[i][0] / max(scores[i][1], 1))


def as_dicts(detections: Detections, min_score: float = 0.0) -> list[dict[str, Any]]:
    """Detections as the {"class_id", "box"} dicts `hits` and `recall` score."""
    return [
        {"class_id": int(c), "box": [float(v) for v in b]}
        for b, s, c in zip(detections.xyxy, detections.scores, detections.class_ids, strict=True)
        if s >= min_score
    ]


def cpu_path_detections(params: PostprocessParams | None = None) -> dict[int, Detections]:
    """Every clip frame through the CPU path (FFmpeg decode, ONNX Runtime FP32 on the demo
    model), by frame index: the reference the GPU path is held to."""
    from vdet.ingest.reader import SourceReader
    from vdet.pipeline.detector import Detector
    from vdet.types import VideoFrame

    out: dict[int, Detections] = {}
    with Detector.open(asset_path("demo.onnx"), "onnxruntime") as cpu:
        reader = SourceReader(str(SAMPLE), source_id="reference")
        with reader:
            reader.open()
            for item in reader.frames():
                if isinstance(item, VideoFrame):
                    ((d, _),) = cpu.detect([item.image_bgr], params or cpu.params)
                    out[item.index] = d
    return out
