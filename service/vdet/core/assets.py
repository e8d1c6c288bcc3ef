"""The files shipped inside the package: the demo model, its CPU INT8 build and the sample clip.

`vdet serve` with no configuration runs the demo model on the sample clip looped as a live
source (vdet.cli), and the bundled demo clip is the one file source the default source policy
allows (vdet.ingest.urls). In a development checkout a file may be absent until it is made.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def assets_dir() -> Path:
    """The package's assets/ folder."""
    return Path(str(files("vdet").joinpath("assets")))


def asset_path(name: str) -> Path:
    """A file of the package's assets/ folder, by name."""
    return assets_dir() / name


def default_model_path() -> Path:
    """The demo model (ONNX, raw YOLOv8 head), the default `model_path`."""
    return asset_path("demo.onnx")


def demo_cpu_int8_path() -> Path:
    """The demo model's INT8 build for ONNX Runtime on the CPU, shipped beside it (made by
    `vdet quantize --target cpu`: docs/quantization.md)."""
    return asset_path("demo.cpu-int8.onnx")


def sample_clip() -> Path:
    """The sample clip: 10 s of 1920x1080, 30 fps H.264 of the demo model's classes (made by
    `vdet generate`), with its exact truth beside it (sample.json); the one file the default
    source policy allows."""
    return asset_path("sample.mp4")
