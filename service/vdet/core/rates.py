"""Event rates over a sliding window: the measured frames per second of a stream.

A `RateMeter` is told when each event happened and says how many happened per second over
the last `window_s` seconds. It owns no clock and no lock: its caller passes the time and
guards it.
"""

from __future__ import annotations

from collections import deque


class RateMeter:
    """Events per second over the last `window_s` seconds (at most `max_events` kept)."""

    def __init__(self, window_s: float = 5.0, max_events: int = 4096) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self.window_s = window_s
        self._times: deque[float] = deque(maxlen=max_events)
        self._started = False

    def add(self, now: float) -> None:
        self._started = True
        self._times.append(now)
        self._prune(now)

    def rate(self, now: float) -> float | None:
        """Events per second in the window ending `now`: None before the first event, 0.0
        with fewer than two in the window. Measured between the window's first and last
        events, so a stream that started a moment ago is not under-reported."""
        self._prune(now)
        if len(self._times) < 2:
            return 0.0 if self._started else None
        span = self._times[-1] - self._times[0]
        return (len(self._times) - 1) / span if span > 0 else 0.0

    def _prune(self, now: float) -> None:
        while self._times and now - self._times[0] > self.window_s:
            self._times.popleft()
