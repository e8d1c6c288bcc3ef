"""Settings: defaults, environment, YAML, precedence and clear rejection of bad keys."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from vdet.config.base import ConfigError
from vdet.config.ingest import IngestSettings
from vdet.config.settings import Settings, load_settings
from vdet.config.streams import StreamSpec
from vdet.core.assets import default_model_path
from vdet.ingest.source_thread import IngestOptions
from vdet.ingest.urls import SourcePolicy


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("VDET_"):
            monkeypatch.delenv(name)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "vdet.yaml"
    path.write_text(text)
    return path


def test_defaults() -> None:
    s = load_settings()
    assert (s.host, s.port, s.api_key, s.max_streams) == ("127.0.0.1", 8000, None, 16)
    assert s.max_upload_bytes == 20 * 1024 * 1024
    assert s.backend == "auto"
    assert s.model_path == default_model_path()
    assert s.model_path.parts[-2:] == ("assets", "demo.onnx")
    assert s.detection.conf_threshold == 0.25
    assert s.detection.iou_threshold == 0.45
    assert s.sources == []
    assert s.log_level == "info"


def test_environment_with_nested_delimiter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VDET_PORT", "9000")
    monkeypatch.setenv("VDET_API_KEY", "s3cret-key")
    monkeypatch.setenv("VDET_DETECTION__CONF_THRESHOLD", "0.5")
    monkeypatch.setenv("VDET_INGEST__STALL_TIMEOUT_S", "2.5")
    monkeypatch.setenv("VDET_SOURCES", '[{"id": "cam", "url": "rtsp://h/s"}]')
    s = load_settings()
    assert s.port == 9000
    assert s.api_key is not None
    assert s.api_key.get_secret_value() == "s3cret-key"
    assert s.detection.conf_threshold == 0.5
    assert s.ingest.stall_timeout_s == 2.5
    assert s.sources == [StreamSpec(id="cam", url="rtsp://h/s")]


def test_yaml_file_and_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(
        tmp_path,
        """
port: 9100
max_streams: 4
detection: {conf_threshold: 0.4, max_det: 50}
hub: {capacity_per_source: 10}
sources:
  - id: gate.cam-1
    url: rtsp://camera.local/stream
    classes: [person, 2]
    conf_threshold: 0.6
""",
    )
    s = load_settings(path)
    assert s.port == 9100
    assert s.max_streams == 4
    assert s.detection.conf_threshold == 0.4
    assert s.detection.max_det == 50
    assert s.detection.iou_threshold == 0.45  # untouched nested default
    assert s.hub.capacity_per_source == 10
    assert s.sources[0].id == "gate.cam-1"
    assert s.sources[0].classes == ["person", 2]
    # The environment overrides the file, keyword arguments override both.
    monkeypatch.setenv("VDET_PORT", "9200")
    assert load_settings(path).port == 9200
    assert load_settings(path, port=9300).port == 9300


def test_config_file_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VDET_CONFIG", str(write(tmp_path, "port: 9400\n")))
    assert load_settings().port == 9400
    assert Settings().port == 9400


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("prot: 9000\n", "prot: unknown key"),
        ("detection: {conf: 0.5}\n", "detection.conf: unknown key"),
        ("sources: [{id: a, url: 'rtsp://h/s', colour: red}]\n", "sources.0.colour: unknown key"),
        ("port: 70000\n", "port: Input should be less than or equal to 65535"),
        ("detection: {conf_threshold: 1.5}\n", "detection.conf_threshold"),
        ("sources: [{id: 'bad id!', url: 'rtsp://h/s'}]\n", "sources.0.id"),
        ("ingest: {backoff_initial_s: 10, backoff_max_s: 1}\n", "must not exceed"),
        ("log_level: verbose\n", "log_level"),
        ("gpu: {devices: [0, 0]}\n", "devices must be distinct GPU indices"),
        ("gpu: {devices: []}\n", "devices must name at least one GPU"),
        ("gpu: {batch: 0}\n", "gpu.batch"),
        ("gpu: {decoder: gpu}\n", "gpu.decoder"),
        ("gpu: {kernels: triton}\n", "gpu.kernels"),
        ("sources: [{id: a, url: 'rtsp://h/s', gpu: -1}]\n", "sources.0.gpu"),
    ],
)
def test_bad_yaml_values_are_rejected_clearly(tmp_path: Path, text: str, fragment: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_settings(path)
    assert fragment in str(err.value)
    assert str(path) in str(err.value)


def test_unknown_environment_variables_are_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VDET_PROT", "9000")
    with pytest.raises(ConfigError, match="VDET_PROT"):
        load_settings()
    monkeypatch.delenv("VDET_PROT")
    monkeypatch.setenv("VDET_DETECTION__CONF", "0.3")
    with pytest.raises(ConfigError, match=r"detection\.conf: unknown key"):
        load_settings()


def test_unreadable_files_are_reported(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_settings(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_settings(write(tmp_path, "port: [1\n"))
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_settings(write(tmp_path, "- 1\n- 2\n"))


def test_api_key_is_secret_and_never_echoed(tmp_path: Path) -> None:
    s = load_settings(api_key="long-enough-key")
    assert "long-enough-key" not in repr(s)
    with pytest.raises(ConfigError) as err:
        load_settings(write(tmp_path, "api_key: short\n"))
    assert "at least 8 characters" in str(err.value)
    assert "short" not in str(err.value).replace("at least", "")


def test_stream_spec_bounds() -> None:
    spec = StreamSpec(id="a_b.c-1", url="rtsp://h/s")
    assert (spec.loop, spec.realtime, spec.classes) == (False, True, None)
    for bad in (
        {"id": "", "url": "rtsp://h/s"},
        {"id": "x" * 65, "url": "rtsp://h/s"},
        {"id": "a/b", "url": "rtsp://h/s"},
        {"id": "a", "url": ""},
        {"id": "a", "url": "rtsp://h/s", "conf_threshold": -0.1},
        {"id": "a", "url": "rtsp://h/s", "iou_threshold": 2},
        {"id": "a", "url": "rtsp://h/s", "max_det": 0},
        {"id": "a", "url": "rtsp://h/s", "classes": []},
        {"id": "a", "url": "rtsp://h/s", "extra": 1},
    ):
        with pytest.raises(ValidationError):
            StreamSpec.model_validate(bad)


def test_every_field_is_described() -> None:
    for model in (Settings, StreamSpec, IngestSettings):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no description"


def test_ingest_options_take_the_settings_defaults_and_bounds() -> None:
    """A source thread's own options have the section's defaults and bounds, and the section
    converts to them losslessly."""
    defaults = IngestOptions()
    for name, field in IngestSettings.model_fields.items():
        if name != "source_policy":
            assert getattr(defaults, name) == field.default, name
    with pytest.raises(ValueError, match="connect_timeout_s must be in"):
        IngestOptions(connect_timeout_s=0.0)
    options = IngestOptions.of(IngestSettings(stall_timeout_s=3.0), loop_files=True, realtime=False)
    assert options == IngestOptions(
        stall_timeout_s=3.0, loop_files=True, realtime=False, policy=SourcePolicy()
    )
    with pytest.raises(ValidationError):
        IngestSettings(connect_timeout_s=0.0)
