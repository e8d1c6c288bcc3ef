"""Decode the raw YOLOv8 head and run NMS: the CPU reference that GPU NMS is tested against.

This module owns turning a raw head [B, 4 + nc, N] (rows 0..3: cx, cy, w, h in input pixels;
rows 4..: per-class scores, already sigmoid'ed) into `Detections`. `decode_and_nms` works in
model-input pixels; `postprocess` also maps boxes back to source pixels through each image's
`LetterboxTransform`. It must not touch images or models. Its parameters, `PostprocessParams`
(re-exported here for the reference's callers), and their defaults are vdet.core.contract's.
docs/conventions.md restates the rules below for kernel authors; any change here is a change of
that contract.

Rules, per image, all arithmetic in float32:

1. Box: x1 = cx - w / 2, y1 = cy - h / 2, x2 = cx + w / 2, y2 = cy + h / 2.
2. Best class per anchor: the highest score; ties go to the lowest class id. An anchor whose
   scores contain NaN is dropped.
3. Keep the anchor when score > conf_threshold (strictly), then, if `classes` is set, when its
   best class is in `classes` (an anchor is never re-labelled with its second-best class).
4. Candidates: the `top_k` highest scores, ties broken by the lower anchor index (stable sort).
5. Greedy NMS in that order: a candidate is kept unless a kept candidate of the same class (any
   class when `class_agnostic`) has IoU > iou_threshold (strictly) with it. IoU = inter /
   (area_i + area_j - inter), areas (x2 - x1) * (y2 - y1) with no +1; IoU is 0 when the union is
   not positive. NMS stops once `max_det` are kept, so the output is the first `max_det` kept.
6. Output order: score descending, ties by anchor index -- the candidate order of step 4.

Differences from Ultralytics' `non_max_suppression` (same results otherwise): Ultralytics keeps
30000 candidates (`max_nms`) instead of `top_k`, separates classes by offsetting boxes by
class * 7680 px (which rounds coordinates; here classes are compared directly), and does not
define the order of tied scores.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from vdet.core.contract import LetterboxTransform
from vdet.core.contract import PostprocessParams as PostprocessParams
from vdet.core.types import Detections, FloatArray

AnchorArray = npt.NDArray[np.intp]


def decode_and_nms(raw: FloatArray, params: PostprocessParams) -> list[Detections]:
    """Decode a raw head [B, 4 + nc, N] and run NMS; boxes stay in model-input pixels."""
    raw = _check_raw(raw)
    return [decode_and_nms_image(head, params)[0] for head in raw]


def postprocess(
    raw: FloatArray, transforms: Sequence[LetterboxTransform], params: PostprocessParams
) -> list[Detections]:
    """`decode_and_nms`, then each image's boxes mapped back to its source pixels."""
    raw = _check_raw(raw)
    if len(transforms) != raw.shape[0]:
        raise ValueError(f"got {len(transforms)} transforms for a batch of {raw.shape[0]}")
    results = []
    for head, transform in zip(raw, transforms, strict=True):
        dets = decode_and_nms_image(head, params)[0]
        results.append(Detections(transform.to_source(dets.xyxy), dets.scores, dets.class_ids))
    return results


def decode_and_nms_image(
    head: FloatArray, params: PostprocessParams
) -> tuple[Detections, AnchorArray]:
    """One image's head [4 + nc, N] -> (detections in input pixels, their anchor indices).

    The anchor indices let a GPU implementation be compared anchor by anchor with this one.
    """
    if head.ndim != 2 or head.shape[0] < 5:
        raise ValueError(f"head must have shape (4 + nc, N) with nc >= 1, got {head.shape}")
    head = np.asarray(head, dtype=np.float32)
    class_scores = head[4:]
    if class_scores.shape[1] == 0:
        return Detections.empty(), np.zeros((0,), np.intp)

    # Max first (a fast reduction), argmax only on the few anchors that pass.
    best_scores = class_scores.max(axis=0)
    anchors = np.flatnonzero(best_scores > np.float32(params.conf_threshold))
    class_ids = np.argmax(class_scores[:, anchors], axis=0).astype(np.int32)
    if params.classes is not None:
        wanted = np.isin(class_ids, np.fromiter(params.classes, np.int32, len(params.classes)))
        anchors, class_ids = anchors[wanted], class_ids[wanted]
    scores = best_scores[anchors]

    # A stable sort of the negated scores keeps tied scores in anchor order.
    order = np.argsort(-scores, kind="stable")[: params.top_k]
    anchors, class_ids, scores = anchors[order], class_ids[order], scores[order]
    xyxy = xywh_to_xyxy(head[:4, anchors].T)

    keep = greedy_nms(
        xyxy,
        class_ids,
        params.iou_threshold,
        class_agnostic=params.class_agnostic,
        max_keep=params.max_det,
    )
    return Detections(xyxy[keep], scores[keep], class_ids[keep]), anchors[keep]


def xywh_to_xyxy(xywh: FloatArray) -> FloatArray:
    """(n, 4) centre-size boxes to corner boxes, in float32 as Ultralytics computes them."""
    xywh = np.asarray(xywh, dtype=np.float32)
    half = xywh[:, 2:] / np.float32(2)
    return np.concatenate((xywh[:, :2] - half, xywh[:, :2] + half), axis=1)


def greedy_nms(
    xyxy: FloatArray,
    class_ids: npt.NDArray[np.int32],
    iou_threshold: float,
    *,
    class_agnostic: bool = False,
    max_keep: int | None = None,
) -> AnchorArray:
    """Greedy NMS over boxes already in priority order; return the kept positions, in order.

    Box i is kept unless an earlier kept box of the same class (any class when `class_agnostic`)
    has IoU > `iou_threshold` with it. Only rows of kept boxes are computed (O(kept * n) time,
    O(n) memory), so a large candidate count does not need an n x n matrix.
    """
    n = len(xyxy)
    limit = n if max_keep is None else min(max_keep, n)
    keep: list[int] = []
    if limit == 0:
        return np.zeros((0,), np.intp)
    x1, y1, x2, y2 = (np.ascontiguousarray(xyxy[:, k], dtype=np.float32) for k in range(4))
    areas = (x2 - x1) * (y2 - y1)
    threshold = np.float32(iou_threshold)
    suppressed = np.zeros(n, np.bool_)
    for i in range(n):
        if suppressed[i]:
            continue
        keep.append(i)
        if len(keep) == limit:
            break
        rest = slice(i + 1, n)
        inter_w = np.maximum(np.minimum(x2[i], x2[rest]) - np.maximum(x1[i], x1[rest]), 0)
        inter_h = np.maximum(np.minimum(y2[i], y2[rest]) - np.maximum(y1[i], y1[rest]), 0)
        inter = inter_w * inter_h
        union = (areas[i] + areas[rest]) - inter
        # A true division (not inter > t * union) rounds like torchvision and float32 kernels;
        # union <= 0 only happens for degenerate boxes, whose IoU is defined as 0.
        iou = np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)
        overlaps = iou > threshold
        if not class_agnostic:
            overlaps &= class_ids[rest] == class_ids[i]
        suppressed[rest] |= overlaps
    return np.asarray(keep, dtype=np.intp)


def _check_raw(raw: FloatArray) -> FloatArray:
    raw = np.asarray(raw, dtype=np.float32)
    if raw.ndim != 3 or raw.shape[1] < 5:
        raise ValueError(f"raw head must have shape (B, 4 + nc, N) with nc >= 1, got {raw.shape}")
    return raw
