"""App fixtures for the API and notify tests: the tiny ONNX model, a short H.264 clip, settings
and a client (each folder's conftest exposes them)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.apptest import CLIP_WH, MakeSettings, TestClient, write_tiny_model
from support.videos import write_h264_clip
from vdet.api.app import create_app
from vdet.config.settings import Settings


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("model") / "tiny.onnx")


@pytest.fixture(scope="session")
def clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """128x96, 30 fps, 1 s of H.264."""
    folder = tmp_path_factory.mktemp("api_clips")
    return write_h264_clip(folder / "clip.mp4", seconds=1.0, fps=30, size_wh=CLIP_WH)


@pytest.fixture
def make_settings(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> MakeSettings:
    """Settings for the tiny model on ONNX Runtime, fast ingest, overridable by keyword.

    Files under the session's temporary folder (the test clips) are allowed sources.
    """
    clips_root = tmp_path_factory.getbasetemp()

    def make(**overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "model_path": tiny_model,
            "backend": "onnxruntime",
            "ingest": {
                "connect_timeout_s": 2.0,
                "read_timeout_s": 2.0,
                "stall_timeout_s": 2.0,
                "backoff_initial_s": 0.05,
                "backoff_max_s": 0.2,
                "source_policy": {"file_roots": [clips_root]},
            },
        }
        values.update(overrides)
        return Settings(**values)

    return make


@pytest.fixture
def client(make_settings: MakeSettings) -> Iterator[TestClient]:
    with TestClient(create_app(make_settings())) as c:
        yield c
