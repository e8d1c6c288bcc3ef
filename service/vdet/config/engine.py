"""TensorRT engines: where they are cached and how they are built (`engine`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from vdet.config.base import Strict


def default_engine_dir() -> Path:
    """The user's cache folder (the GPU image sets VDET_ENGINE__CACHE_DIR to its volume)."""
    cache_home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache_home) / "vdet" / "engines"


class EngineSettings(Strict):
    """TensorRT engines: where they are cached and how `vdet engine build` builds them.

    The tensorrt backend and `vdet engine build` read the same values, so a served engine is
    the one that was built. See docs/tensorrt.md.
    """

    cache_dir: Path = Field(
        default_factory=default_engine_dir,
        description="Engine cache folder (plans and their JSON manifests). Default: "
        "$XDG_CACHE_HOME/vdet/engines, else ~/.cache/vdet/engines.",
    )
    plugin_library: Path | None = Field(
        default=None,
        description="libvdet_plugins.so, needed only with plugin_nms; null: the CMake build "
        "folders of a checkout.",
    )
    precision: Literal["auto", "fp32", "fp16", "int8"] = Field(
        default="auto",
        description="auto: what the ONNX carries (Q/DQ int8, fp16, else fp32). fp16 of an fp32 "
        "ONNX: the FP16 builder flag on TensorRT 10, an AutoCast conversion on 11. int8 needs "
        "a Q/DQ ONNX from `vdet quantize`.",
    )
    min_batch: int = Field(default=1, ge=1, le=1024, description="Smallest batch of the profile.")
    opt_batch: int = Field(
        default=1, ge=1, le=1024, description="Batch the engine is tuned for (dynamic models)."
    )
    max_batch: int = Field(default=8, ge=1, le=1024, description="Largest batch of the profile.")
    workspace_mib: int | None = Field(
        default=None,
        ge=16,
        le=1 << 20,
        description="Builder workspace limit in MiB; null: TensorRT's default (device memory).",
    )
    optimization_level: int = Field(
        default=3, ge=0, le=5, description="TensorRT builder optimization level (0-5)."
    )
    timing_cache: Path | None = Field(
        default=None,
        description="Timing cache file, reused and updated by every build; null: one per GPU "
        "model and TensorRT version inside cache_dir.",
    )
    plugin_nms: bool = Field(
        default=False,
        description="Build end-to-end engines with the decode + NMS plugin node "
        "(detections out, not the raw head). Serving runs NMS itself, so leave this off.",
    )
    build_in_background: bool = Field(
        default=True,
        description="When serving and no valid engine is cached: serve on ONNX Runtime and "
        "switch to TensorRT once the engine is built, instead of waiting for the build.",
    )

    @model_validator(mode="after")
    def _profile_order(self) -> EngineSettings:
        if not self.min_batch <= self.opt_batch <= self.max_batch:
            raise ValueError(
                f"min_batch <= opt_batch <= max_batch must hold, got {self.min_batch}, "
                f"{self.opt_batch}, {self.max_batch}"
            )
        return self
