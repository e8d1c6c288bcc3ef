"""Frames as pictures: detections drawn on a frame, scaled down, encoded as JPEG.

What every picture vdet serves goes through: a stream's latest frame (the snapshot route and the
live view, vdet.streams.local), event snapshots (vdet.streams.event_snapshots) and `vdet detect
--draw`. Pure and CPU-bound: call it from a thread, never on the event loop.
"""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np

from vdet.core.types import Detections, ImageArray

DEFAULT_QUALITY = 85


def encode_frame(
    image_bgr: ImageArray,
    detections: Detections | None,
    names: Sequence[str],
    *,
    quality: int = DEFAULT_QUALITY,
    max_width: int | None = None,
) -> tuple[bytes, tuple[int, int]]:
    """JPEG of a BGR frame with `detections` drawn (None: none), scaled down to `max_width`;
    and the JPEG's (width, height)."""
    image = image_bgr
    if detections is not None:
        image = draw_detections(image, detections, names)
    source_h, source_w = image.shape[:2]
    if max_width is not None and source_w > max_width:
        height = max(1, round(source_h * max_width / source_w))
        scaled = cv2.resize(image, (max_width, height), interpolation=cv2.INTER_AREA)
        image = np.ascontiguousarray(scaled, dtype=np.uint8)
    h, w = image.shape[:2]
    return encode_jpeg(image, quality), (w, h)


def _colour(class_id: int) -> tuple[int, int, int]:
    # A fixed, well-spread hue per class so the same class keeps its colour across frames.
    hue = (class_id * 47) % 180
    hsv = np.array([[[hue, 220, 255]]], np.uint8)
    b, g, r = cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR)[0, 0]
    return int(b), int(g), int(r)


def draw_detections(
    image_bgr: ImageArray, detections: Detections, names: Sequence[str]
) -> ImageArray:
    """A copy of the image with each box and its 'name score' label drawn on it."""
    canvas = image_bgr.copy()
    thickness = max(1, round(min(canvas.shape[:2]) / 360))
    scale = max(0.35, min(canvas.shape[:2]) / 1200)
    for box, score, cid in zip(
        detections.xyxy.tolist(),
        detections.scores.tolist(),
        detections.class_ids.tolist(),
        strict=True,
    ):
        x1, y1, x2, y2 = (round(v) for v in box)
        colour = _colour(cid)
        cv2.rectangle(canvas, (x1, y1), (max(x1, x2 - 1), max(y1, y2 - 1)), colour, thickness)
        label = f"{names[cid] if 0 <= cid < len(names) else cid} {score:.2f}"
        (tw, th), base = cv2.getTextSize(label, cv2.FONT_HERSHEY_SIMPLEX, scale, 1)
        ty = y1 - 2 if y1 - th - base - 2 >= 0 else y1 + th + 2
        cv2.rectangle(canvas, (x1, ty - th - 2), (x1 + tw + 2, ty + base - 1), colour, -1)
        cv2.putText(canvas, label, (x1 + 1, ty - 1), cv2.FONT_HERSHEY_SIMPLEX, scale, (0, 0, 0), 1)
    return canvas


def encode_jpeg(image_bgr: ImageArray, quality: int = 85) -> bytes:
    ok, buf = cv2.imencode(".jpg", image_bgr, [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise RuntimeError("JPEG encoding failed")
    return bytes(buf.tobytes())
