"""The detector a service runs: its model on the configured backend, with the default
thresholds, and on the CPU the build and the sessions that keep up there.

`open_configured_detector` is the usual factory (vdet.root passes it on; tests and benchmarks
pass their own). It only opens models: where streams run, and on how many cores, is the
root's to decide.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from vdet.config.settings import Settings
from vdet.core.assets import default_model_path, demo_cpu_int8_path
from vdet.inference.detector import Detector
from vdet.inference.postprocess import PostprocessParams

log = logging.getLogger(__name__)

DetectorFactory = Callable[[Settings], Detector]


def open_detector(settings: Settings, backend: str | None = None, **options: Any) -> Detector:
    """The detector for `settings`: its model on `backend` (default: the configured one, with
    backend `options`), with the default thresholds."""
    d = settings.detection
    params = PostprocessParams(
        conf_threshold=d.conf_threshold,
        iou_threshold=d.iou_threshold,
        top_k=d.top_k,
        max_det=d.max_det,
    )
    return Detector.open(
        settings.model_path,
        backend or settings.backend,
        params=params,
        input_shape=settings.input_shape,
        **options,
    )


# ONNX Runtime sessions of the service's detector on a CPU of 2 cores or more, unless
# `cpu_sessions` says otherwise: each stream keeps as many frames in detection at once (see
# OnnxRuntimeBackend and StreamManager).
CPU_SESSIONS = 2


def cpu_sessions(settings: Settings) -> int:
    """ONNX Runtime sessions for `settings`: `cpu_sessions`, else `CPU_SESSIONS` where there
    are that many cores, else 1."""
    if settings.cpu_sessions is not None:
        return settings.cpu_sessions
    return CPU_SESSIONS if _cores() >= CPU_SESSIONS else 1


def open_configured_detector(settings: Settings) -> Detector:
    """The configured detector; where that is ONNX Runtime (configured, or what `auto` chose),
    with `cpu_sessions` sessions, so that each stream keeps that many frames in detection
    (two on 2 cores: nearly twice the frames per second of one frame at a time)."""
    sessions = cpu_sessions(settings)
    if settings.backend == "onnxruntime":
        return open_detector(on_cpu(settings), sessions=sessions)
    detector = open_detector(settings)
    backend = detector.backend
    cpu = on_cpu(settings)
    if backend.name != "onnxruntime" or (
        backend.parallel_calls == sessions and cpu.model_path == settings.model_path
    ):
        return detector
    # `auto` chose ONNX Runtime: the other backends take no `sessions` (nor the CPU's model),
    # so it could not be asked for up front. Loading again costs a fraction of a second, once.
    detector.close()
    reopened = open_detector(cpu, "onnxruntime", sessions=sessions)
    reopened.backend.selection = backend.selection
    return reopened


def on_cpu(settings: Settings) -> Settings:
    """The settings to open ONNX Runtime with: the bundled demo model becomes its INT8 build
    beside it, the one that keeps the demo stream in real time on 2 cores (docs/benchmarks.md);
    any other model as is (`vdet quantize --target cpu` makes a model's INT8 build)."""
    int8 = demo_cpu_int8_path()
    if not (int8.is_file() and _is_bundled_demo(settings.model_path)):
        return settings
    log.info("ONNX Runtime runs the bundled demo model's INT8 build %s", int8.name)
    return settings.model_copy(update={"model_path": int8})


def _is_bundled_demo(path: os.PathLike[str] | str) -> bool:
    try:
        return os.path.samefile(path, default_model_path())
    except OSError:
        return False


def _cores() -> int:
    return os.cpu_count() or 1


def open_worker_detector(settings: Settings, cpu_threads: int | None) -> Detector:
    """The detector of a stream worker process: the usual one, but on ONNX Runtime (the CPU)
    one session with the worker's share of the cores (`cpu_threads`) where it has one."""
    if cpu_threads is None or settings.backend not in ("auto", "onnxruntime"):
        return open_configured_detector(settings)
    return open_detector(on_cpu(settings), "onnxruntime", threads=cpu_threads)
