"""Live video for viewers: admission under a cap, and encodes shared and bounded.

A viewer (one open MJPEG response) holds a `ViewerSlot` from `LiveVideo.admit`; at most
`live.max_viewers` are open at once. Frames are encoded only while a slot for that stream is
open, at most once per new picture per (stream, boxes, width, newest or processed frames) and
at most live.max_fps times a second: viewers asking for the same picture share one encode, and
encodes run on at most `live.encoder_threads` worker threads, never on the event loop. Frames
come from `Pictures.picture` and nowhere else.

This module owns admission, sharing and the multipart framing; it does not pace viewers
(the route does) or decide where frames come from (frames.py does).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass
from typing import Protocol

import anyio
import anyio.to_thread

from vdet.config.live import LiveSettings
from vdet.metrics.registry import Metrics
from vdet.streams.service import EncodedFrame, Picture, PictureRequest

BOUNDARY = "vdetframe"
MEDIA_TYPE = f"multipart/x-mixed-replace; boundary={BOUNDARY}"


class Pictures(Protocol):
    """Where a viewer's frames come from: the stream service (`StreamReads.picture`), or in a
    fleet the node that runs the stream (vdet.api.fleet_reads.OwnerPictures). Called on an
    encoder thread; raises UnknownStreamError once the stream is gone."""

    def picture(self, stream_id: str, request: PictureRequest) -> EncodedFrame | None: ...


class ViewerLimitError(Exception):
    """`live.max_viewers` live responses are already open."""


@dataclass(frozen=True)
class PictureKey:
    """What a viewer sees: viewers with equal keys share every encode."""

    stream_id: str
    boxes: bool
    max_width: int
    newest: bool = True  # the newest decoded frame (True) or the last processed one


class ViewerSlot:
    """One admitted viewer; `release()` is idempotent and frees the slot."""

    def __init__(self, live: LiveVideo, key: PictureKey) -> None:
        self._live = live
        self.key = key
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._live._release(self.key)


class LiveVideo:
    """Live viewers of one app instance. All methods run on the event loop."""

    def __init__(self, settings: LiveSettings, metrics: Metrics) -> None:
        self.settings = settings
        self._metrics = metrics
        self._limiter = anyio.CapacityLimiter(settings.encoder_threads)
        self._viewers: Counter[PictureKey] = Counter()
        # The last encode of each watched picture and when it was asked for (loop time).
        self._latest: dict[PictureKey, tuple[EncodedFrame, float]] = {}
        self._pending: dict[PictureKey, asyncio.Task[EncodedFrame | None]] = {}

    @property
    def viewers(self) -> int:
        return sum(self._viewers.values())

    def admit(self, key: PictureKey) -> ViewerSlot:
        """A slot for a new viewer of `key`; ViewerLimitError when all are taken."""
        if self.viewers >= self.settings.max_viewers:
            raise ViewerLimitError(
                f"{self.settings.max_viewers} live viewer(s) already (live.max_viewers); "
                "close one or retry later"
            )
        self._viewers[key] += 1
        self._metrics.live_viewers.inc()
        return ViewerSlot(self, key)

    def _release(self, key: PictureKey) -> None:
        self._viewers[key] -= 1
        self._metrics.live_viewers.dec()
        if self._viewers[key] <= 0:
            del self._viewers[key]
            self._latest.pop(key, None)  # nobody watches: keep nothing

    async def next_frame(
        self, streams: Pictures, key: PictureKey, last: Picture | None
    ) -> EncodedFrame | None:
        """The newest frame of `key` unless it shows `last` (the viewer's last picture).

        An encode asked for less than 1 / live.max_fps seconds ago is shared rather than
        repeated, so a stream costs at most live.max_fps encodes a second per picture key
        however many viewers watch it, whatever their phases. One encode of a key runs at a
        time and each shows the stream's latest frame then, so a picture other than `last` is
        a newer one. Raises UnknownStreamError once the stream is gone.
        """
        now = asyncio.get_running_loop().time()
        cached = self._latest.get(key)
        if cached is not None:
            shared, asked_at = cached
            if shared.picture != last and now - asked_at < 1.0 / self.settings.max_fps:
                return shared
        task = self._pending.get(key)
        if task is None:
            task = asyncio.create_task(self._encode(streams, key, last, now))
            # Retrieved even when every viewer waiting for it has left (no "never retrieved").
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            self._pending[key] = task
        # Shielded: a viewer leaving must not cancel an encode the others are waiting for.
        fresh = await asyncio.shield(task)
        best = self._latest.get(key)
        frame = best[0] if best is not None else fresh
        return frame if frame is not None and frame.picture != last else None

    async def _encode(
        self, streams: Pictures, key: PictureKey, last: Picture | None, asked_at: float
    ) -> EncodedFrame | None:
        """Encode `key`'s picture unless it is the last one encoded (or, before any, `last`);
        keep what is newest for the viewers still watching. One runs per key at a time."""
        cached = self._latest.get(key)
        unless = cached[0].picture if cached is not None else last
        try:
            fresh = await anyio.to_thread.run_sync(
                self._encode_in_thread, streams, key, unless, limiter=self._limiter
            )
        finally:
            self._pending.pop(key, None)
        if key in self._viewers:
            if fresh is not None:
                self._latest[key] = (fresh, asked_at)
            elif cached is not None:  # unchanged since: as good as encoded now
                self._latest[key] = (cached[0], asked_at)
        return fresh

    def _encode_in_thread(
        self, streams: Pictures, key: PictureKey, unless: Picture | None
    ) -> EncodedFrame | None:
        started = time.perf_counter()
        request = PictureRequest(
            boxes=key.boxes,
            quality=self.settings.jpeg_quality,
            max_width=key.max_width,
            newest=key.newest,
            unless=unless,
        )
        frame = streams.picture(key.stream_id, request)
        if frame is not None:
            self._metrics.live_encode_seconds.observe(time.perf_counter() - started)
        return frame


def multipart_part(frame: EncodedFrame) -> bytes:
    """One part of the multipart/x-mixed-replace body: the frame, which result goes with it,
    and its source size.

    `X-Vdet-Seq` is the seq of the result that goes with the frame (the WebSocket feed's
    `seq`), so a client drawing overlays itself pairs frame and boxes as the server would;
    `X-Vdet-Frame` is the frame's index in its stream and `X-Vdet-Result-Frame` the index of
    the frame that result was detected on (equal for a processed frame; smaller for a newer
    decoded frame shown with the newest result).
    """
    head = (
        f"--{BOUNDARY}\r\n"
        "Content-Type: image/jpeg\r\n"
        f"Content-Length: {len(frame.jpeg)}\r\n"
        f"X-Vdet-Seq: {frame.seq}\r\n"
        f"X-Vdet-Frame: {frame.frame_index}\r\n"
        f"X-Vdet-Result-Frame: {frame.result_frame_index}\r\n"
        f"X-Vdet-Source-Size: {frame.source_width}x{frame.source_height}\r\n\r\n"
    )
    return head.encode("ascii") + frame.jpeg + b"\r\n"
