"""The latest processed frame of a stream as JPEG: the one place frames leave the pipeline.

`latest_jpeg` is what the snapshot route and the live video feed both call. It owns where a
stream's last frame comes from (the stream manager's snapshot, in this process or in the worker
process that runs the stream: `StreamService.latest_jpeg`) and how
it becomes a JPEG (optionally with its boxes drawn, optionally scaled down). It does not pace,
count viewers or speak HTTP. CPU-bound and may block on the manager's locks: call it from a
worker thread, never on the event loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import cv2
import numpy as np

from vdet.api.images import draw_detections, encode_jpeg
from vdet.streams import StreamManager

if TYPE_CHECKING:
    from vdet.runtime import StreamService
from vdet.types import Detections, ImageArray

DEFAULT_QUALITY = 85


@dataclass(frozen=True)
class EncodedFrame:
    """One processed frame of a stream, encoded."""

    seq: int  # the seq of the result detected on this frame (matches the WebSocket feed)
    jpeg: bytes
    width: int  # of the JPEG
    height: int
    source_width: int  # of the decoded frame, the space detection boxes are in
    source_height: int
    frame_index: int = 0  # the frame's index in its stream (what a worker knows it by)


def latest_jpeg(
    streams: StreamService,
    stream_id: str,
    *,
    boxes: bool = True,
    quality: int = DEFAULT_QUALITY,
    max_width: int | None = None,
    newer_than: int = 0,
) -> EncodedFrame | None:
    """The last processed frame of `stream_id` as JPEG, or None if it has none newer than
    the result seq `newer_than` (0: any). Raises UnknownStreamError.

    `boxes` draws the frame's detections on it (at source resolution, before any scaling);
    `max_width` scales the frame down (never up) to at most that many pixels across. Where
    the stream runs (this process or a worker process) decides where it is encoded:
    `StreamService.latest_jpeg`, which ends in `encode_latest` below.
    """
    return streams.latest_jpeg(
        stream_id, boxes=boxes, quality=quality, max_width=max_width, newer_than=newer_than
    )


def encode_latest(
    manager: StreamManager,
    stream_id: str,
    *,
    boxes: bool,
    quality: int,
    max_width: int | None,
    newer_than: int,
) -> EncodedFrame | None:
    """`latest_jpeg` for a stream of the stream manager in this process."""
    peek = manager.snapshot(stream_id)  # cheap: no copy, no GPU download
    if peek is None or peek.result.seq <= newer_than:
        return None
    snap = manager.snapshot_image(stream_id)
    if snap is None:
        return None
    image, result = snap
    jpeg, (w, h) = encode_frame(
        image,
        result.detections if boxes else None,
        manager.class_names,
        quality=quality,
        max_width=max_width,
    )
    source_h, source_w = image.shape[:2]
    return EncodedFrame(
        seq=result.seq,
        jpeg=jpeg,
        width=w,
        height=h,
        source_width=source_w,
        source_height=source_h,
        frame_index=result.frame_index,
    )


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
