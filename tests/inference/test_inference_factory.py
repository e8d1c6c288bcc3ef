"""The service's detector on the CPU: two ONNX Runtime sessions where there are two cores,
configured or chosen by `auto`, so each stream keeps two frames in detection; the bundled demo
model as its INT8 build, a model of one's own as it is."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import onnx
import pytest

from vdet.config.settings import Settings
from vdet.core.assets import asset_path, demo_cpu_int8_path
from vdet.core.model import file_sha256, load_model_info
from vdet.inference import factory


@pytest.mark.parametrize("backend", ["onnxruntime", "auto"])
@pytest.mark.parametrize(("cores", "sessions"), [(2, 2), (8, 2), (1, 1)])
def test_cpu_detector_sessions(
    monkeypatch: pytest.MonkeyPatch, backend: str, cores: int, sessions: int
) -> None:
    monkeypatch.setattr(factory.os, "cpu_count", lambda: cores)
    settings = Settings(model_path=asset_path("demo.onnx"), backend=backend)
    with factory.open_configured_detector(settings) as detector:
        if detector.backend.name != "onnxruntime":
            pytest.skip(f"auto chose {detector.backend.name} here")
        assert detector.parallel_frames == sessions
        # `auto` still says what it chose and why
        assert detector.backend.selection.startswith("auto" if backend == "auto" else "configured")


@pytest.mark.parametrize("backend", ["onnxruntime", "auto"])
def test_cpu_sessions_setting_wins(backend: str) -> None:
    settings = Settings(model_path=asset_path("demo.onnx"), backend=backend, cpu_sessions=1)
    with factory.open_configured_detector(settings) as detector:
        if detector.backend.name != "onnxruntime":
            pytest.skip(f"auto chose {detector.backend.name} here")
        assert detector.parallel_frames == 1 and "sessions" not in detector.backend.device


@pytest.mark.parametrize("value", [0, 17])
def test_cpu_sessions_bounds(value: int) -> None:
    with pytest.raises(ValueError, match="cpu_sessions"):
        Settings(cpu_sessions=value)


@pytest.mark.parametrize("backend", ["onnxruntime", "auto"])
def test_the_bundled_demo_runs_as_its_int8_build_on_onnxruntime(backend: str) -> None:
    with factory.open_configured_detector(Settings(backend=backend)) as detector:
        if detector.backend.name != "onnxruntime":
            pytest.skip(f"auto chose {detector.backend.name} here")
        assert detector.info.path.name == "demo.cpu-int8.onnx"
        assert detector.backend.precision == "int8"  # what /readyz and vdet_backend say
        assert detector.parallel_frames == factory.cpu_sessions(Settings())


def test_a_model_of_ones_own_is_never_swapped(tmp_path: Path) -> None:
    own = tmp_path / "mine.onnx"
    shutil.copyfile(asset_path("demo.onnx"), own)
    settings = Settings(model_path=own, backend="onnxruntime")
    assert factory.on_cpu(settings) is settings
    with factory.open_configured_detector(settings) as detector:
        assert detector.info.path == own


def test_the_int8_build_is_of_the_bundled_demo_model() -> None:
    """Made by `vdet quantize --target cpu` from this very demo.onnx: a new demo model needs a
    new INT8 build (docs/quantization.md says how)."""
    int8 = onnx.load(str(demo_cpu_int8_path()), load_external_data=False)
    provenance = json.loads(
        next(p.value for p in int8.metadata_props if p.key == "vdet_quantization")
    )
    assert provenance["target"] == "cpu"
    assert provenance["source_model_sha256"] == file_sha256(asset_path("demo.onnx"))
    assert (
        load_model_info(demo_cpu_int8_path()).names
        == load_model_info(asset_path("demo.onnx")).names
    )
