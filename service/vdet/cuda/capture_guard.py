"""Keeps CUDA-graph capture apart from the process's other CUDA work.

A capture records every launch on its stream until it ends; CUDA invalidates it if work that
must synchronise with that stream happens meanwhile (the legacy default stream, which NVDEC's
internals may use, a device-wide synchronise, an allocation that frees memory in use). With
dozens of sources, some runner is always decoding or launching while another captures, and an
invalidated capture surfaced as a CUDA error that aborted the process (64 streams on one
GPU). Captures are rare (once per stream and shape) and short; frames are many and
short. So: a readers-writer lock, `CUDA_WORK`. Every piece of per-frame CUDA work (an NVDEC
decode call, a runner's replay or eager frame) holds it shared, many at once; a capture holds
it exclusively, waiting for work in flight to finish and holding new work back until done.

The shared side must cost next to nothing: it is taken several times per frame by every
stream's threads, and one lock shared by them all became the bottleneck (64 streams: half of all
thread samples waited on it, each holder queueing for the GIL before it could let go). So each
thread has a lock of its own, which only a capture ever contends: `work()` takes the calling
thread's lock, `capture()` takes every thread's (and holds back threads not seen before).

This module only coordinates; it touches no CUDA itself. `work()` may nest within a thread; a
thread holding the shared side must not ask for the exclusive side.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType


class _ThreadWork:
    """One thread's side of the guard: its own lock, taken around each piece of CUDA work."""

    __slots__ = ("depth", "guard", "ident", "lock", "locked_by_me", "thread")

    def __init__(self, guard: CaptureGuard) -> None:
        self.guard = guard
        self.lock = threading.Lock()
        self.depth = 0
        self.locked_by_me = False
        self.thread = weakref.ref(threading.current_thread())
        self.ident = threading.get_ident()

    def __enter__(self) -> None:
        if self.depth == 0:
            guard = self.guard
            # The capturing thread already holds every lock, its own included.
            if guard._capturer != self.ident:
                if guard._capture_wanted:  # a capture is taking every lock: let it have ours
                    guard._no_capture_wanted.wait()
                self.lock.acquire()
                self.locked_by_me = True
        self.depth += 1

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.depth -= 1
        if self.depth == 0 and self.locked_by_me:
            self.locked_by_me = False
            self.lock.release()


class CaptureGuard:
    """A readers-writer lock built from per-thread locks: `work()` shared, `capture()` exclusive."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._threads: list[_ThreadWork] = []
        self._registry = threading.Lock()  # held by a capture: no new thread starts work
        self._one_capture = threading.Lock()
        self._capturing = False
        self._capturer: int | None = None
        self._capture_wanted = False
        self._no_capture_wanted = threading.Event()
        self._no_capture_wanted.set()

    def work(self) -> _ThreadWork:
        """Per-frame CUDA work (a context manager); waits while a capture runs."""
        mine: _ThreadWork | None = getattr(self._local, "work", None)
        if mine is None:
            mine = _ThreadWork(self)
            with self._registry:
                self._threads.append(mine)
            self._local.work = mine
        return mine

    @contextmanager
    def capture(self) -> Iterator[None]:
        """A CUDA-graph capture: alone, once the work in flight has finished."""
        with self._one_capture:
            self._capture_wanted = True
            self._no_capture_wanted.clear()
            held: list[threading.Lock] = []
            try:
                with self._registry:
                    for work in self._threads:
                        work.lock.acquire()  # waits for that thread's work in flight
                        held.append(work.lock)
                    self._capturing = True
                    self._capturer = threading.get_ident()
                    try:
                        yield
                    finally:
                        self._capturer = None
                        self._capturing = False
                        # Threads that ended leave the registry (their locks are free).
                        self._threads = [w for w in self._threads if _alive(w)]
            finally:
                for lock in held:
                    lock.release()
                self._capture_wanted = False
                self._no_capture_wanted.set()

    @property
    def busy(self) -> tuple[int, bool]:
        """(threads with work in flight, capture running), for tests and diagnostics."""
        if self._capturing:
            return 0, True
        with self._registry:
            return sum(w.lock.locked() for w in self._threads), False


def _alive(work: _ThreadWork) -> bool:
    thread = work.thread()
    return thread is not None and thread.is_alive()


CUDA_WORK = CaptureGuard()

__all__ = ["CUDA_WORK", "CaptureGuard"]
