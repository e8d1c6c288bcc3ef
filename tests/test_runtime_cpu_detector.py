"""The service's detector on the CPU: two ONNX Runtime sessions where there are two cores,
configured or chosen by `auto`, so each stream keeps two frames in detection."""

from __future__ import annotations

import pytest

from vdet import runtime
from vdet.cli import asset_path
from vdet.config import Settings


@pytest.mark.parametrize("backend", ["onnxruntime", "auto"])
@pytest.mark.parametrize(("cores", "sessions"), [(2, 2), (8, 2), (1, 1)])
def test_cpu_detector_sessions(
    monkeypatch: pytest.MonkeyPatch, backend: str, cores: int, sessions: int
) -> None:
    monkeypatch.setattr(runtime.os, "cpu_count", lambda: cores)
    settings = Settings(model_path=asset_path("demo.onnx"), backend=backend)
    with runtime.default_detector_factory(settings) as detector:
        if detector.backend.name != "onnxruntime":
            pytest.skip(f"auto chose {detector.backend.name} here")
        assert detector.parallel_frames == sessions
        # `auto` still says what it chose and why
        assert detector.backend.selection.startswith("auto" if backend == "auto" else "configured")


@pytest.mark.parametrize("backend", ["onnxruntime", "auto"])
def test_cpu_sessions_setting_wins(backend: str) -> None:
    settings = Settings(model_path=asset_path("demo.onnx"), backend=backend, cpu_sessions=1)
    with runtime.default_detector_factory(settings) as detector:
        if detector.backend.name != "onnxruntime":
            pytest.skip(f"auto chose {detector.backend.name} here")
        assert detector.parallel_frames == 1 and "sessions" not in detector.backend.device


@pytest.mark.parametrize("value", [0, 17])
def test_cpu_sessions_bounds(value: int) -> None:
    with pytest.raises(ValueError, match="cpu_sessions"):
        Settings(cpu_sessions=value)
