"""Score thresholds per class over a stream's own (`StreamSpec.class_thresholds`).

Decode + NMS (the CPU reference, the CUDA kernel, the TensorRT plugin) take one threshold, so a
stream with per-class thresholds is detected at the lowest of them (`floor`) and `keep` then
drops each detection under its own class's threshold (the stream's `conf_threshold` for a class
not listed), on the host, before tracking. With NMS per class (vdet's default) this is what
thresholding each class before NMS would give: a box only ever suppresses boxes of its own class
that score lower, which its class's threshold would drop first. What it cannot give back: with
more than `max_det` boxes over the floor, boxes under their class's threshold take some of the
`max_det` places before they are dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from vdet.core.types import Detections


@dataclass(frozen=True)
class ClassThresholds:
    """`default` for every class but those in `by_class` (class id -> threshold)."""

    default: float
    by_class: tuple[tuple[int, float], ...]

    @classmethod
    def of(cls, default: float, by_class: Mapping[int, float]) -> ClassThresholds | None:
        """None when there is nothing per class (the detector's own threshold does it all)."""
        if not by_class:
            return None
        return cls(default, tuple(sorted(by_class.items())))

    @property
    def floor(self) -> float:
        """The threshold to detect at: the lowest of all."""
        return min(self.default, *(t for _, t in self.by_class))

    def keep(self, detections: Detections) -> Detections:
        """`detections` without those at or under their class's threshold (scores must exceed
        a threshold, as in decode + NMS); the same object when all pass."""
        if not len(detections):
            return detections
        thresholds = np.full(len(detections), self.default, np.float32)
        for class_id, threshold in self.by_class:
            thresholds[detections.class_ids == class_id] = threshold
        keep = detections.scores > thresholds
        return detections if keep.all() else detections.select(keep)


def thresholds_by_class(
    thresholds: Mapping[str, float] | None,
    resolve: Callable[[Sequence[str | int]], frozenset[int] | None],
) -> dict[int, float]:
    """{class name or id: threshold} -> {class id: threshold}, `resolve` naming the model's
    classes (ValueError for unknown ones)."""
    if not thresholds:
        return {}
    ids = {ref: resolve([ref]) or frozenset() for ref in thresholds}
    return {class_id: thresholds[ref] for ref, found in ids.items() for class_id in found}


__all__ = ["ClassThresholds", "thresholds_by_class"]
