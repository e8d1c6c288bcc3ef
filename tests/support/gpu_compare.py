"""What the GPU tests of the torch backend and of rectangular inputs compare with: synthetic
scenes as NV12 frames, the CPU pipeline's detections on the same frame, and how close FP16
detections must come to them (docs/conventions.md). Imports torch through vdet.gpu: import it
only from GPU tests, after their skips."""

from __future__ import annotations

import cv2
import numpy as np
import torch

from vdet.core.types import ColourMatrix, ColourRange, Detections
from vdet.gpu.frame_ops import Nv12Geometry, nv12_to_rgb_u8
from vdet.inference.detector import Detector
from vdet.inference.postprocess import PostprocessParams
from vdet.modelkit.dataset.synthetic import SceneConfig, render_image

PARAMS = PostprocessParams()


def _scene(seed: int, size: tuple[int, int] = (1280, 720)) -> np.ndarray:
    return render_image(seed, SceneConfig(width=size[0], height=size[1])).image_bgr


def _nv12(bgr: np.ndarray) -> np.ndarray:
    h, w = bgr.shape[:2]
    i420 = cv2.cvtColor(bgr, cv2.COLOR_BGR2YUV_I420)
    u = i420[h : h + h // 4].reshape(h // 2, w // 2)
    v = i420[h + h // 4 :].reshape(h // 2, w // 2)
    uv = np.stack((u, v), axis=-1).reshape(h // 2, w)
    return np.ascontiguousarray(np.concatenate((i420[:h], uv)))


def _geometry(w: int, h: int) -> Nv12Geometry:
    return Nv12Geometry.of((w, h), (640, 640), ColourMatrix.BT601, ColourRange.LIMITED)


def _cpu_detections(nv12: np.ndarray, geometry: Nv12Geometry, detector: Detector) -> Detections:
    rgb = nv12_to_rgb_u8(torch.from_numpy(nv12), geometry).numpy().astype(np.uint8)
    bgr = np.ascontiguousarray(rgb.transpose(1, 2, 0)[:, :, ::-1])
    return detector.detect([bgr], PARAMS)[0][0]


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(rb - lt, 0, None).prod(axis=2)
    area_a = (a[:, 2:] - a[:, :2]).prod(axis=1)
    area_b = (b[:, 2:] - b[:, :2]).prod(axis=1)
    return inter / np.maximum(area_a[:, None] + area_b[None, :] - inter, 1e-9)


def _assert_matches(got: Detections, expected: Detections, min_score: float = 0.5) -> None:
    """Every confident expected detection has a twin in `got` (module docstring)."""
    strong = expected.scores >= min_score
    assert strong.any(), "the scene should hold confident detections"
    boxes = expected.xyxy[strong]
    iou = _iou(boxes, got.xyxy) if len(got) else np.zeros((len(boxes), 0))
    for row, (cls, score) in enumerate(
        zip(expected.class_ids[strong], expected.scores[strong], strict=True)
    ):
        near = np.abs(got.xyxy - boxes[row]).max(axis=1) <= 4.0 if len(got) else iou[row] > 1
        twins = (
            ((iou[row] >= 0.85) | near)
            & (got.class_ids == cls)
            & (np.abs(got.scores - score) <= 0.03)
        )
        assert twins.any(), f"no match for class {cls} score {score:.3f} box {boxes[row]}"
