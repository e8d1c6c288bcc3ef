"""A backend that can be replaced while it serves: the hand-off from one engine to the next.

This module owns switching every stream from one backend to another without stopping them:
`SwappableBackend` forwards `infer` to its current backend, `swap` installs a new one for every
later call, and the old one is closed once the calls already running on it return. It is how the
service keeps serving on ONNX Runtime (or an older engine) while a TensorRT engine builds in the
background (`vdet.tensorrt.cache.BackgroundEngineBuilder`). It registers no backend kind and
must not build anything itself.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from vdet.core.types import FloatArray
from vdet.inference.backends.base import InferenceBackend
from vdet.tensorrt.cache import BackgroundEngineBuilder

log = logging.getLogger(__name__)


class SwappableBackend(InferenceBackend):
    """Forwards to one backend at a time; `swap` replaces it for all later calls.

    The replacement must run the same model signature (class names and input size), so that
    callers holding `info` stay right. `name`, `info` and `precision` follow the current
    backend.
    """

    def __init__(self, initial: InferenceBackend) -> None:
        self._lock = threading.Lock()
        self._current = initial
        self._in_flight: dict[int, int] = {}  # id(backend) -> calls running on it
        self._retired: dict[int, InferenceBackend] = {}
        self._closed = False
        self.name = initial.name
        self.info = initial.info

    @property
    def current(self) -> InferenceBackend:
        return self._current

    @property
    def device(self) -> str:
        return self._current.device

    @property
    def max_batch(self) -> int | None:
        return self._current.max_batch

    @property
    def precision(self) -> str:
        return str(getattr(self._current, "precision", "fp32"))

    def infer(self, batch: FloatArray) -> FloatArray:
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self!r} is closed")
            backend = self._current
            self._in_flight[id(backend)] = self._in_flight.get(id(backend), 0) + 1
        try:
            return backend.infer(batch)
        finally:
            self._release(backend)

    def swap(self, new: InferenceBackend) -> InferenceBackend:
        """Make `new` serve every later call; return the previous backend.

        The previous backend is closed as soon as no call is running on it (now, or when the
        last running call returns).
        """
        if new.info.names != self.info.names or new.info.input_hw != self.info.input_hw:
            raise ValueError(
                f"cannot swap {self._current!r} for {new!r}: the model signatures differ "
                f"({len(self.info.names)} classes at {self.info.input_hw} vs "
                f"{len(new.info.names)} at {new.info.input_hw})"
            )
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self!r} is closed")
            old = self._current
            self._current = new
            self.name = new.name
            self.info = new.info
            close_now = self._in_flight.get(id(old), 0) == 0
            if not close_now:
                self._retired[id(old)] = old
        log.info("inference moved from %s to %s", old.device, new.device)
        if close_now:
            old.close()
        return old

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            current = self._current
            busy = self._in_flight.get(id(current), 0) > 0
            if busy:
                self._retired[id(current)] = current
        if not busy:
            current.close()

    def _release(self, backend: InferenceBackend) -> None:
        with self._lock:
            remaining = self._in_flight[id(backend)] - 1
            if remaining:
                self._in_flight[id(backend)] = remaining
                return
            del self._in_flight[id(backend)]
            retired = self._retired.pop(id(backend), None)
        if retired is not None:
            retired.close()


def serve_while_building(
    fallback: InferenceBackend,
    build: Callable[[], InferenceBackend],
    name: str = "vdet-engine-build",
) -> tuple[SwappableBackend, BackgroundEngineBuilder[InferenceBackend]]:
    """Serve on `fallback` now; build the real backend on a thread and switch to it when ready.

    A failed build leaves `fallback` serving (the error is logged and kept on the builder). A
    backend that finishes building after the swappable one was closed is closed, not leaked.
    """
    swappable = SwappableBackend(fallback)

    def hand_over(new: InferenceBackend) -> None:
        try:
            swappable.swap(new)
        except Exception:
            new.close()
            raise

    def stay(exc: BaseException) -> None:
        log.warning("still serving on %s: the engine build failed (%s)", fallback.device, exc)

    builder: BackgroundEngineBuilder[InferenceBackend] = BackgroundEngineBuilder(
        build, hand_over, on_error=stay, name=name
    )
    builder.start()
    return swappable, builder
