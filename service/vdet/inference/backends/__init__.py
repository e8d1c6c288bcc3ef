"""The registry of inference backends and `create_backend`, the one way to construct them.

This package owns choosing a backend by name. Each backend module registers a `BackendSpec` (its
kind, a factory, whether it can run here, which model files it reads, and a priority for `auto`)
when it is imported. Every module in this package (`onnxruntime`, later `torch`, `tensorrt`) is
imported on the first `create_backend` / `known_backends` call, so adding a backend is adding a
file; a module whose import fails (its library is missing) is skipped and named in errors. A
backend module elsewhere calls `register_backend` itself and must be imported first. Backend
modules should import their heavy library at module level only if a failed import should hide
the backend entirely.

`create_backend("auto", path)` tries, among registered backends that are available on this
machine and accept the file, the highest priority first, and takes the first that loads:
tensorrt (300, full TensorRT on any NVIDIA GPU) > tensorrt-rtx (290, TensorRT for RTX on the
GPUs it targets) > torch on CUDA (200) > onnxruntime (100). A factory that raises (an engine
that cannot be built or loaded) is logged and passed over. The backend it returns says why it
was chosen (`InferenceBackend.selection`).
"""

from __future__ import annotations

import importlib
import logging
import os
import pkgutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vdet.inference.backends.base import InferenceBackend

AUTO = "auto"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BackendSpec:
    """How to build one kind of backend and when `auto` may choose it."""

    kind: str
    factory: Callable[..., InferenceBackend]
    priority: int
    is_available: Callable[[], bool]
    accepts: Callable[[Path], bool]
    # Why `is_available` is False here, for `auto`'s explanation; None: "not available here".
    unavailable_reason: Callable[[], str] | None = None

    def why_unavailable(self) -> str:
        if self.unavailable_reason is None:
            return "not available here"
        try:
            return self.unavailable_reason()
        except Exception as exc:  # an explanation must never stop the choice
            return f"not available here ({exc})"


_REGISTRY: dict[str, BackendSpec] = {}
_SKIPPED: dict[str, str] = {}  # backend module name -> why its import failed
_discovery_lock = threading.RLock()
_discovered = False


def register_backend(spec: BackendSpec) -> None:
    """Add or replace a backend kind; backend modules call this when they are imported."""
    if spec.kind == AUTO or not spec.kind:
        raise ValueError(f"{spec.kind!r} cannot be a backend kind")
    _REGISTRY[spec.kind] = spec


def known_backends() -> tuple[str, ...]:
    """Every kind `create_backend` accepts, `auto` first."""
    _discover()
    return (AUTO, *sorted(_REGISTRY))


def create_backend(
    kind: str, model_path: str | os.PathLike[str], **options: Any
) -> InferenceBackend:
    """Construct a backend of `kind` (or the best available for `auto`) for a model file.

    `options` go to the backend's constructor (e.g. `threads=2` for onnxruntime).
    """
    _discover()
    path = Path(model_path)
    if kind == AUTO:
        return _first_that_loads(path, options)
    if kind not in _REGISTRY:
        raise ValueError(
            f"unknown backend {kind!r}; known: {', '.join(known_backends())}{_skipped_note()}"
        )
    backend = _REGISTRY[kind].factory(path, **options)
    backend.selection = f"configured: backend {kind}"
    return backend


def _first_that_loads(path: Path, options: dict[str, Any]) -> InferenceBackend:
    """`auto`: the highest-priority available backend whose factory succeeds."""
    ranked = sorted((s for s in _REGISTRY.values() if s.accepts(path)), key=lambda s: -s.priority)
    passed_over: list[str] = []
    failures: list[BaseException] = []
    for spec in ranked:
        if not spec.is_available():
            passed_over.append(f"{spec.kind}: {spec.why_unavailable()}")
            continue
        try:
            backend = spec.factory(path, **options)
        except Exception as exc:
            log.warning(
                "backend auto: %s cannot serve %s (%s); trying the next", spec.kind, path, exc
            )
            passed_over.append(f"{spec.kind}: failed to load ({exc})")
            failures.append(exc)
            continue
        why = f"auto: {spec.kind}, the highest-priority backend that loads here"
        backend.selection = why + (
            f" (passed over: {'; '.join(passed_over)})" if passed_over else ""
        )
        return backend
    if failures:
        raise failures[-1]
    raise ValueError(
        f"no registered backend can run {path} here; known: "
        f"{', '.join(known_backends())}{_skipped_note()}"
    )


def _discover() -> None:
    """Import every backend module of this package once, so each registers itself."""
    global _discovered
    with _discovery_lock:
        if _discovered:
            return
        # Set first: a backend module that asks for the registry while importing must not recurse.
        _discovered = True
        for module in pkgutil.iter_modules(__path__):
            if module.name == "base":
                continue
            try:
                importlib.import_module(f"{__name__}.{module.name}")
            except ImportError as exc:
                _SKIPPED[module.name] = str(exc)


def _skipped_note() -> str:
    if not _SKIPPED:
        return ""
    reasons = "; ".join(f"{name}: {why}" for name, why in sorted(_SKIPPED.items()))
    return f" (not loaded: {reasons})"


__all__ = [
    "AUTO",
    "BackendSpec",
    "InferenceBackend",
    "create_backend",
    "known_backends",
    "register_backend",
]
