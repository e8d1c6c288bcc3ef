"""Which frames of a stream to detect on when it asks for fewer detections than frames.

A camera at 25-30 frames/s often needs detecting only a few times a second (a parking lot, a
door), and a small machine may not keep up with every frame at all. Left alone, the second
case drops whichever frames arrive while detection is busy: at uneven gaps, with the CPU flat
out. A stream's `detect_fps` instead picks frames at an even spacing, before detection, so the
machine does only that much work and each result is a fixed time after the last.

Spacing follows the frames' own clock: the presentation time where the stream has one (so a
file analysed faster than real time still gets `detect_fps` detections per second *of video*),
else the arrival time. Every frame is still decoded (a video's frames depend on each other);
a frame that is not picked costs its decode only.

This module knows nothing of streams or threads: one `FrameSampler` per stream, in its
mailbox (vdet.ingest.mailbox), which calls it under its lock.
"""

from __future__ import annotations

# A frame a little early still counts as due: frame times are multiples of the source's frame
# step (33.3 ms at 30 fps), which rarely divide the interval exactly, and 0.0999... must not lose
# to 0.1 by a rounding error and slip a frame. "A little": this fraction of the interval, and
# less than half the source's own step, so that the frame before the due one never counts.
_EARLY_FRACTION = 0.2
_EARLY_OF_STEP = 0.5


class FrameSampler:
    """Picks frames at most `fps` a second, evenly spaced on the frames' clock.

    `fps` None picks every frame. Each pick moves the next due time on by one interval from
    the last due time, so picks stay on a grid (30 frames/s at `fps` 10: every third frame)
    instead of drifting by the source's jitter. A jump forward (a stall, a reconnect) restarts
    the grid at the frame after it; a step back (a looped file starting over) picks at once.
    """

    def __init__(self, fps: float | None = None) -> None:
        self._interval: float | None = None
        self._next_due: float | None = None
        self._last_time: float | None = None
        self.set_rate(fps)

    @property
    def fps(self) -> float | None:
        return None if self._interval is None else 1.0 / self._interval

    def set_rate(self, fps: float | None) -> None:
        """Change the rate from the next frame on (None: every frame)."""
        if fps is not None and (isinstance(fps, bool) or not fps > 0):
            raise ValueError(f"fps must be positive or None, got {fps!r}")
        interval = None if fps is None else 1.0 / fps
        if interval != self._interval:
            self._interval, self._next_due = interval, None

    def take(self, frame_time: float) -> bool:
        """Whether the frame at `frame_time` (seconds on the frames' clock) is detected."""
        interval = self._interval
        last, self._last_time = self._last_time, frame_time
        if interval is None:
            return True
        early = _EARLY_FRACTION * interval
        if last is not None and frame_time > last:
            early = min(early, _EARLY_OF_STEP * (frame_time - last))
        due = self._next_due
        if due is not None and frame_time < due - interval:  # the clock went back: start over
            due = None
        if due is not None and frame_time < due - early:
            return False
        if due is None or frame_time - due >= interval:  # first frame, or a jump forward
            self._next_due = frame_time + interval
        else:
            self._next_due = due + interval
        return True
