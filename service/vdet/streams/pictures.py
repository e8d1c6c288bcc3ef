"""A stream's latest frame as JPEG: the one place frames leave the pipeline.

`latest_jpeg` is what the snapshot route and the live video feed both call. It owns where a
stream's latest frame comes from (the stream manager's last processed or newest decoded frame,
in this process or in the worker process that runs the stream: `StreamService.latest_jpeg`)
and how it becomes a JPEG (optionally with its boxes drawn, optionally scaled down). It does
not pace, count viewers or speak HTTP. CPU-bound and may block on the manager's locks: call it
from a worker thread, never on the event loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import cv2
import numpy as np

from vdet.api.images import draw_detections, encode_jpeg
from vdet.streams.manager import StreamManager

if TYPE_CHECKING:
    from vdet.root import StreamService
from vdet.core.types import Detections, ImageArray

DEFAULT_QUALITY = 85


Picture = tuple[int, int | None]
"""What a live frame shows: (the frame's index, the index of the frame its drawn boxes were
detected on, or None when none are drawn). Two encodes with equal pictures are the same JPEG."""


@dataclass(frozen=True)
class EncodedFrame:
    """One frame of a stream, encoded, and the result that goes with it."""

    seq: int  # the seq of the result that goes with the frame (as the WebSocket feed has it)
    jpeg: bytes
    width: int  # of the JPEG
    height: int
    source_width: int  # of the decoded frame, the space detection boxes are in
    source_height: int
    frame_index: int = 0  # the frame's index in its stream (what a worker knows it by)
    # The frame the result was detected on: frame_index itself for a processed frame, an
    # earlier one for a newer decoded frame shown with the newest result.
    result_frame_index: int = 0
    boxes_drawn: bool = False

    @property
    def picture(self) -> Picture:
        return (self.frame_index, self.result_frame_index if self.boxes_drawn else None)


def latest_jpeg(
    streams: StreamService,
    stream_id: str,
    *,
    boxes: bool = True,
    quality: int = DEFAULT_QUALITY,
    max_width: int | None = None,
    newest: bool = False,
    unless: Picture | None = None,
) -> EncodedFrame | None:
    """A stream's latest frame as JPEG, with the result that goes with it; None before its
    first result, or when the frame would show `unless` (already sent). Raises
    UnknownStreamError.

    The frame is the last processed one, with the result detected on it; with `newest`, the
    newest decoded frame when ingest has a newer one in host memory (CPU decoding), with the
    newest result, detected on an earlier frame: a live view then runs at its own rate, not
    the detection rate, its boxes a detection's latency behind the picture.
    `boxes` draws the result's detections on it (at source resolution, before any scaling);
    `max_width` scales the frame down (never up) to at most that many pixels across. Where
    the stream runs (this process or a worker process) decides where it is encoded:
    `StreamService.latest_jpeg`, which ends in `encode_latest` below.
    """
    return streams.latest_jpeg(
        stream_id,
        boxes=boxes,
        quality=quality,
        max_width=max_width,
        newest=newest,
        unless=unless,
    )


def encode_latest(
    manager: StreamManager,
    stream_id: str,
    *,
    boxes: bool,
    quality: int,
    max_width: int | None,
    newest: bool,
    unless: Picture | None,
) -> EncodedFrame | None:
    """`latest_jpeg` for a stream of the stream manager in this process."""
    # Cheap: no copy, no GPU download, until the picture is known to be wanted.
    snap = manager.newest_frame(stream_id) if newest else manager.snapshot(stream_id)
    if snap is None:
        return None
    frame, result = snap.frame, snap.result
    if unless is not None and (frame.index, result.frame_index if boxes else None) == unless:
        return None
    image = manager.host_image(stream_id, frame)
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
        frame_index=frame.index,
        result_frame_index=result.frame_index,
        boxes_drawn=boxes,
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
