"""Live video for viewers: admission under a cap, and encodes shared and bounded.

A viewer (one open MJPEG response) holds a `ViewerSlot` from `LiveVideo.admit`; at most
`live.max_viewers` are open at once. Frames are encoded only while a slot for that stream is
open, at most once per new result per (stream, boxes, width): viewers asking for the same
picture share one encode, and encodes run on at most `live.encoder_threads` worker threads,
never on the event loop. Frames come from `vdet.api.frames.latest_jpeg` and nowhere else.

This module owns admission, sharing and the multipart framing; it does not pace viewers
(the route does) or decide where frames come from (frames.py does).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass

import anyio
import anyio.to_thread

from vdet.api.frames import EncodedFrame, latest_jpeg
from vdet.config import LiveSettings
from vdet.metrics import Metrics
from vdet.runtime import StreamService

BOUNDARY = "vdetframe"
MEDIA_TYPE = f"multipart/x-mixed-replace; boundary={BOUNDARY}"


class ViewerLimitError(Exception):
    """`live.max_viewers` live responses are already open."""


@dataclass(frozen=True)
class PictureKey:
    """What a viewer sees: viewers with equal keys share every encode."""

    stream_id: str
    boxes: bool
    max_width: int


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
        self._latest: dict[PictureKey, EncodedFrame] = {}
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
        self, streams: StreamService, key: PictureKey, after_seq: int
    ) -> EncodedFrame | None:
        """The newest frame of `key` if its seq is above `after_seq`, else None.

        Raises UnknownStreamError once the stream is gone.
        """
        cached = self._latest.get(key)
        task = self._pending.get(key)
        if task is None:
            newer_than = max(after_seq, cached.seq if cached is not None else 0)
            task = asyncio.create_task(self._encode(streams, key, newer_than))
            # Retrieved even when every viewer waiting for it has left (no "never retrieved").
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            self._pending[key] = task
        # Shielded: a viewer leaving must not cancel an encode the others are waiting for.
        frame = await asyncio.shield(task)
        if frame is not None and key in self._viewers:
            current = self._latest.get(key)
            if current is None or current.seq < frame.seq:
                self._latest[key] = frame
        best = self._latest.get(key, frame)
        return best if best is not None and best.seq > after_seq else None

    async def _encode(
        self, streams: StreamService, key: PictureKey, newer_than: int
    ) -> EncodedFrame | None:
        try:
            return await anyio.to_thread.run_sync(
                self._encode_in_thread, streams, key, newer_than, limiter=self._limiter
            )
        finally:
            self._pending.pop(key, None)

    def _encode_in_thread(
        self, streams: StreamService, key: PictureKey, newer_than: int
    ) -> EncodedFrame | None:
        started = time.perf_counter()
        frame = latest_jpeg(
            streams,
            key.stream_id,
            boxes=key.boxes,
            quality=self.settings.jpeg_quality,
            max_width=key.max_width,
            newer_than=newer_than,
        )
        if frame is not None:
            self._metrics.live_encode_seconds.observe(time.perf_counter() - started)
        return frame


def multipart_part(frame: EncodedFrame) -> bytes:
    """One part of the multipart/x-mixed-replace body, with the frame's seq and source size.

    `X-Vdet-Seq` is the seq of the result detected on this very frame (the WebSocket feed's
    `seq`), so a client drawing overlays itself can pair frame and boxes exactly.
    """
    head = (
        f"--{BOUNDARY}\r\n"
        "Content-Type: image/jpeg\r\n"
        f"Content-Length: {len(frame.jpeg)}\r\n"
        f"X-Vdet-Seq: {frame.seq}\r\n"
        f"X-Vdet-Source-Size: {frame.source_width}x{frame.source_height}\r\n\r\n"
    )
    return head.encode("ascii") + frame.jpeg + b"\r\n"
