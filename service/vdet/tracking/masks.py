"""Masks: polygons of a stream where detections are dropped before tracking (`kind: mask`
among its zones): a parked car, a poster, a screen that shows people. A detection whose anchor
point (its box's center or bottom center, as the mask says) lies inside a mask, or on its edge,
is gone from the frame's result: it starts no track, causes no zone event and is not counted.
A mask with `classes` drops only those classes.

The stream manager applies `drop_masked` on each stream's pipeline thread, between detection
and tracking, whatever ran the detection (ONNX Runtime, the GPU path): it works on the boxes in
source pixels. Zone monitors never see masks (`without_masks`).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from vdet.core.geometry import points_in_polygon
from vdet.core.types import Detections
from vdet.tracking.zones import Zone


def without_masks(zones: tuple[Zone, ...]) -> tuple[tuple[Zone, ...], tuple[Zone, ...]]:
    """(masks, the other zones), each in the order given."""
    masks = tuple(z for z in zones if z.kind == "mask")
    if not masks:
        return (), zones
    return masks, tuple(z for z in zones if z.kind != "mask")


def anchor_points(xyxy: npt.NDArray[np.float32], anchor: str) -> npt.NDArray[np.float64]:
    """(N, 2) points of boxes: their center, or their bottom edge's center."""
    boxes = np.asarray(xyxy, np.float64)
    x = (boxes[:, 0] + boxes[:, 2]) / 2
    y = boxes[:, 3] if anchor == "bottom_center" else (boxes[:, 1] + boxes[:, 3]) / 2
    return np.stack([x, y], axis=1)


def drop_masked(
    detections: Detections, size_wh: tuple[int, int], masks: tuple[Zone, ...]
) -> Detections:
    """`detections` without those a mask covers (module docstring); the same object when none
    is covered."""
    if not masks or not len(detections):
        return detections
    keep = np.ones(len(detections), np.bool_)
    for mask in masks:
        points = anchor_points(detections.xyxy, mask.anchor)
        inside = points_in_polygon(points, mask.pixels(size_wh))
        if mask.classes is not None:
            inside &= np.isin(detections.class_ids, np.fromiter(mask.classes, np.int64))
        keep &= ~inside
    return detections if keep.all() else detections.select(keep)


__all__ = ["anchor_points", "drop_masked", "without_masks"]
