"""Keeps CUDA-graph capture apart from the process's other CUDA work.

A capture records every launch on its stream until it ends; CUDA invalidates it if work that
must synchronise with that stream happens meanwhile (the legacy default stream, which NVDEC's
internals may use, a device-wide synchronise, an allocation that frees memory in use). With
dozens of sources, some runner is always decoding or launching while another captures, and an
invalidated capture surfaced as a CUDA error that aborted the process (64 streams on an H200,
2026-12-02). Captures are rare (once per stream and shape) and short; frames are many and
short. So: a readers-writer lock, `CUDA_WORK`. Every piece of per-frame CUDA work (an NVDEC
decode call, a runner's replay or eager frame) holds it shared, many at once; a capture holds
it exclusively, waiting for work in flight to finish and holding new work back until done.

This module only coordinates; it touches no CUDA itself. Not reentrant: a thread holding the
shared side must not ask for the exclusive side.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class CaptureGuard:
    """A writer-preferring readers-writer lock: `work()` shared, `capture()` exclusive."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._workers = 0
        self._capturing = False
        self._captures_waiting = 0

    @contextmanager
    def work(self) -> Iterator[None]:
        """Per-frame CUDA work; waits while a capture runs or is waiting to run."""
        with self._cond:
            while self._capturing or self._captures_waiting:
                self._cond.wait()
            self._workers += 1
        try:
            yield
        finally:
            with self._cond:
                self._workers -= 1
                if not self._workers:
                    self._cond.notify_all()

    @contextmanager
    def capture(self) -> Iterator[None]:
        """A CUDA-graph capture: alone, once the work in flight has finished."""
        with self._cond:
            self._captures_waiting += 1
            try:
                while self._capturing or self._workers:
                    self._cond.wait()
            finally:
                self._captures_waiting -= 1
            self._capturing = True
        try:
            yield
        finally:
            with self._cond:
                self._capturing = False
                self._cond.notify_all()

    @property
    def busy(self) -> tuple[int, bool]:
        """(work in flight, capture running), for tests and diagnostics."""
        with self._cond:
            return self._workers, self._capturing


CUDA_WORK = CaptureGuard()

__all__ = ["CUDA_WORK", "CaptureGuard"]
