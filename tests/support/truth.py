"""The sample clip and its exact truth for the tests; the scoring is the package's own
(vdet.modelkit.dataset.clip_truth, which the accuracy benchmark uses too)."""

from __future__ import annotations

from vdet.core.assets import sample_clip
from vdet.modelkit.dataset.clip_truth import (
    as_dicts,
    best_aligned_frame,
    countable,
    cpu_path_detections,
    hits,
    iou,
    recall,
    sample_truth,
)

SAMPLE = sample_clip()
TRUTH = sample_truth()

__all__ = [
    "SAMPLE",
    "TRUTH",
    "as_dicts",
    "best_aligned_frame",
    "countable",
    "cpu_path_detections",
    "hits",
    "iou",
    "recall",
]
