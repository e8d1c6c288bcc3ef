"""The GPU data path: NVDEC, GPUs, CUDA graphs, batching, MPS (`gpu`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from vdet.config.base import Strict


class GpuSettings(Strict):
    """The GPU data path: NVDEC decode, which GPUs, batching across sources, MPS.

    Used only when the inference backend runs on a GPU (torch, TensorRT); with ONNX Runtime on
    the CPU every stream decodes on the CPU and these settings are ignored. How the GPU does its
    work (vdet's kernels in CUDA graphs, threads sleeping while they wait) is not a setting:
    vdet.gpu.devices.GpuTuning holds those choices, measured once, for tests and the lab's
    comparisons. See docs/gpu-data-path.md.
    """

    decoder: Literal["auto", "nvdec", "cpu"] = Field(
        default="auto",
        description="auto: NVDEC where PyNvVideoCodec and the GPU can decode the stream, else "
        "the CPU; nvdec: NVDEC or fail; cpu: always decode on the CPU.",
    )
    devices: list[int] | None = Field(
        default=None,
        max_length=64,
        description="GPU indices to use (one GPU device each); null: every GPU.",
    )
    max_streams_per_gpu: int | None = Field(
        default=None, ge=1, le=1024, description="Most streams one GPU device takes; null: no cap."
    )
    batch: int = Field(
        default=1,
        ge=1,
        le=64,
        description="1: each stream replays its own CUDA graph on its own CUDA stream (lowest "
        "latency). K > 1: up to K ready frames of a GPU's streams share one graph of the "
        "smallest batch-size bucket (1, 2, 4, .., K) that holds them; each stream's thread "
        "preprocesses its own frame into the batch. More frames per second where the GPU is "
        "the limit (several processes sharing it through MPS), fewer within one busy process.",
    )
    batch_wait_ms: float = Field(
        default=2.0,
        ge=0.0,
        le=100.0,
        description="With batch > 1: how long a batch waits for more frames once it has one.",
    )
    kernel_cache_dir: Path | None = Field(
        default=None,
        description="Where vdet's CUDA kernels are kept once NVRTC has compiled them for a GPU "
        "architecture (the first start on a new GPU compiles them, later ones load them). "
        "null: $XDG_CACHE_HOME/vdet/kernels, else ~/.cache/vdet/kernels.",
    )
    mps: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="NVIDIA MPS for the stream worker processes sharing a GPU (their kernels "
        "then run concurrently instead of time-sliced): on starts a private MPS control daemon "
        "for vdet's own workers and fails if it cannot; auto does so when "
        "nvidia-cuda-mps-control exists, no MPS daemon is already reachable and a GPU has "
        "more than one worker; off never. An MPS daemon that is already running (CUDA_MPS_PIPE_"
        "DIRECTORY) is used as it is. vdet stops the daemon it started.",
    )

    @field_validator("devices")
    @classmethod
    def _distinct_devices(cls, value: list[int] | None) -> list[int] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("devices must name at least one GPU, or be null for all")
        if any(i < 0 for i in value) or len(set(value)) != len(value):
            raise ValueError(f"devices must be distinct GPU indices >= 0, got {value}")
        return value
