"""The API process's measurements of its own stalls: event-loop lag and garbage-collection pauses.

One probe task per app sleeps a short, fixed interval and records how much later than asked
the loop woke: everything the loop serves (WebSocket messages, requests) waits at least that
long. A `gc.callbacks` hook times each collection by generation; a full collection stops every
thread of the process, the loop included, so its pauses explain much of the lag.

The hook runs inside the collector, on whichever thread allocated, possibly one holding a
metric's lock: it only appends to a deque, and the probe task moves what it recorded into the
metrics. It owns no other state and changes no collector setting.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import time
from collections.abc import AsyncIterator
from typing import Any

from vdet.metrics.registry import Metrics

# Often enough to catch stalls of a few milliseconds, rarely enough to cost nothing measurable
# (20 wake-ups a second, each a few microseconds).
PROBE_INTERVAL_S = 0.05
# Collections recorded between two probe ticks, at most (young ones run hundreds a second at
# thousands of results a second); older records are dropped rather than grown without bound.
_MAX_PENDING_PAUSES = 4096


class _GcTimer:
    """A `gc.callbacks` hook: (generation, seconds) of each collection, kept for the probe."""

    def __init__(self) -> None:
        self.pauses: collections.deque[tuple[int, float]] = collections.deque(
            maxlen=_MAX_PENDING_PAUSES
        )
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses.append((info["generation"], time.perf_counter() - self._started))


async def _probe(metrics: Metrics, gc_timer: _GcTimer) -> None:
    loop = asyncio.get_running_loop()
    while True:
        asked = loop.time()
        await asyncio.sleep(PROBE_INTERVAL_S)
        metrics.observe_loop_lag(max(0.0, loop.time() - asked - PROBE_INTERVAL_S))
        while gc_timer.pauses:
            generation, seconds = gc_timer.pauses.popleft()
            metrics.observe_gc_pause(generation, seconds)


@contextlib.asynccontextmanager
async def measured(metrics: Metrics) -> AsyncIterator[None]:
    """Measure loop lag and collection pauses into `metrics` while the block runs (an app's
    lifespan)."""
    gc_timer = _GcTimer()
    gc.callbacks.append(gc_timer)
    task = asyncio.create_task(_probe(metrics, gc_timer), name="vdet-loop-health")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        gc.callbacks.remove(gc_timer)
