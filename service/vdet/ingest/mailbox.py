"""A per-source latest-frame slot between a decoding thread and whoever consumes its frames.

Decoding must never wait for inference: a camera that is not read falls behind and its server
drops the connection or buffers seconds of latency. So the producer's `put` never blocks; a
frame that nobody took before the next one arrived is replaced and counted as dropped, the way
a live view skips frames rather than lagging. The consumer always gets the newest frame.

A file that is not paced like a camera is another matter: nobody is waiting on the far end, and
whoever analyses a recording wants every frame of it. Its producer passes `keep_waiting` to
`put`, which then waits while `lossless_depth` frames are waiting to be taken (lossless), so
decoding runs at the speed of detection instead of racing ahead and throwing frames away, and
the consumer takes them in order. With a depth of one, decoding and detection take turns frame
by frame and each waits whenever the other has a slow frame; a few frames of slack
(`StreamManager(unpaced_queue_frames=...)`) let each run at its own average speed, at one frame's
memory per frame of depth.

One producer (the source thread) and any number of consumers; thread-safe. It does not know
about sources' states or the pipeline's batching.

A stream may ask for fewer detections than frames (`set_detect_fps`): the box then takes only
evenly spaced frames (vdet.ingest.sampling) and lets the others go at once, counted as `skipped`,
not `dropped`. Deciding here, where frames change hands, means a frame that is not wanted never
occupies the slot: it cannot push out one that is, nor hold a lossless producer up.

The box also keeps a reference to the newest frame in host memory ever put, taken or not, so a
live view can show decoded frames at its own rate rather than only those detection got to. It
costs no copy (ingest makes a fresh array per frame) and at most one frame's memory. Frames in
GPU memory are not kept: a decoder's pooled surfaces must go back to their pool once detected.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

from vdet.core.types import DecodedFrame, VideoFrame
from vdet.ingest.sampling import FrameSampler

# How often a lossless `put` asks its producer whether to keep waiting for the taker.
_WAIT_CHECK_S = 0.1


class FrameMailbox:
    """Holds the newest frame that has not been taken yet; a lossless producer's frames queue,
    up to `lossless_depth` of them, and are taken oldest first."""

    def __init__(self, lossless_depth: int = 1) -> None:
        if isinstance(lossless_depth, bool) or not isinstance(lossless_depth, int):
            raise TypeError(f"lossless_depth must be an int, got {lossless_depth!r}")
        if lossless_depth < 1:
            raise ValueError(f"lossless_depth must be at least 1, got {lossless_depth}")
        self._cond = threading.Condition(threading.Lock())
        self._lossless_depth = lossless_depth
        self._frames: collections.deque[DecodedFrame] = collections.deque()
        self._newest_on_host: VideoFrame | None = None
        self._closed = False
        self._put = 0
        self._dropped = 0
        self._delivered = 0
        self._skipped = 0
        self._sampler = FrameSampler()

    def put(self, frame: DecodedFrame, *, keep_waiting: Callable[[], bool] | None = None) -> bool:
        """Offer `frame`; False (and nothing stored) once the box is closed.

        Without `keep_waiting` it never blocks: a frame still waiting is replaced and counted in
        `dropped`. With it, `put` first waits while `lossless_depth` frames are waiting, asking
        `keep_waiting()` every `_WAIT_CHECK_S` whether to go on (the producer stopping says
        no; then the oldest waiting frame is dropped to make room). A frame that
        `set_detect_fps` does not want is let go at once and counted in `skipped` (True:
        accepted, not lost).
        """
        with self._cond:
            if self._closed:
                return False
            if isinstance(frame, VideoFrame):
                self._newest_on_host = frame
            clock = frame.pts_seconds if frame.pts_seconds is not None else frame.arrival_time
            if not self._sampler.take(clock):
                self._skipped += 1
                return True
            room = 1 if keep_waiting is None else self._lossless_depth
            if keep_waiting is not None:
                while len(self._frames) >= room and not self._closed:
                    if not self._cond.wait(_WAIT_CHECK_S) and not keep_waiting():
                        break
            if self._closed:
                return False
            while len(self._frames) >= room:
                self._frames.popleft()
                self._dropped += 1
            self._frames.append(frame)
            self._put += 1
            self._cond.notify()
            return True

    def get(self, timeout: float | None = None) -> DecodedFrame | None:
        """Take the next frame (the newest; of a lossless producer's queue, the oldest), waiting
        up to `timeout` seconds (None: until one or close).

        Returns None on timeout, or at once when the box is closed and empty. Frames put before
        `close()` are still handed out, so a finished file's last frames are not lost.
        """
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        with self._cond:
            while not self._frames and not self._closed:
                if deadline is None:
                    self._cond.wait()
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._cond.wait(remaining)
            if not self._frames:
                return None
            frame = self._frames.popleft()
            self._delivered += 1
            self._cond.notify_all()  # a lossless producer waits for room
            return frame

    def set_detect_fps(self, fps: float | None) -> None:
        """Take at most `fps` frames a second from the next `put` on (None: every frame)."""
        with self._cond:
            self._sampler.set_rate(fps)

    def close(self) -> None:
        """Refuse further frames and wake every waiting `get`. Idempotent."""
        with self._cond:
            self._closed = True
            self._newest_on_host = None
            self._cond.notify_all()

    @property
    def closed(self) -> bool:
        with self._cond:
            return self._closed

    @property
    def newest_on_host(self) -> VideoFrame | None:
        """The newest frame in host memory put, taken or not; None before one or once closed."""
        with self._cond:
            return self._newest_on_host

    @property
    def pending(self) -> bool:
        """Whether a frame is waiting to be taken."""
        with self._cond:
            return bool(self._frames)

    @property
    def put_count(self) -> int:
        """Frames accepted by `put` (delivered + dropped + those pending; not the skipped)."""
        with self._cond:
            return self._put

    @property
    def dropped(self) -> int:
        """Frames replaced by a newer one before anybody took them."""
        with self._cond:
            return self._dropped

    @property
    def skipped(self) -> int:
        """Frames let go because `set_detect_fps` did not want them."""
        with self._cond:
            return self._skipped

    @property
    def delivered(self) -> int:
        """Frames handed out by `get`."""
        with self._cond:
            return self._delivered
