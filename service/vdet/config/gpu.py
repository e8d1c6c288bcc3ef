"""The GPU data path: NVDEC, GPUs, CUDA graphs, batching, MPS (`gpu`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from vdet.config.base import Strict


class GpuSettings(Strict):
    """The GPU data path: NVDEC decode, per-GPU devices, CUDA graphs, batching across sources.

    Used only when the inference backend runs on a GPU (torch); with ONNX Runtime on the CPU
    every stream decodes on the CPU and these settings are ignored. See docs/gpu-data-path.md.
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
    batch_frames_per_stream: int = Field(
        default=2,
        ge=1,
        le=4,
        description="With batch > 1: frames of one stream in detection at once. 2 lets a "
        "stream's next frame be staged into the next batch while its last one runs, so batches "
        "follow each other without the GPU waiting for results to reach the streams.",
    )
    cuda_graphs: bool = Field(
        default=True, description="Capture each frame's work in a CUDA graph (else eager)."
    )
    kernels: Literal["auto", "cuda", "torch"] = Field(
        default="auto",
        description="Preprocess and decode+NMS ops: cuda (vdet's CUDA kernels, compiled by "
        "NVRTC), torch (reference torch ops), auto (cuda when cuda-python and NVRTC import).",
    )
    layer_kernels: bool = Field(
        default=True,
        description="Torch networks: run each conv's bias + SiLU and SPPF's max pools through "
        "vdet's own kernels (one pass each instead of torch's separate kernels; FP16 "
        "channels_last on CUDA, where cuda-python compiles them). false: torch's own layers.",
    )
    host_wait: Literal["block", "spin", "yield", "auto"] = Field(
        default="block",
        description="How threads wait for the GPU (NVDEC calls, each frame's result): block "
        "sleeps until the GPU signals (cores stay free for the streams with work; best with "
        "many streams), spin busy-waits (a few microseconds sooner per wait, one core per "
        "waiting thread), yield spins but yields, auto is CUDA's default (spin here). See "
        "docs/gpu-data-path.md.",
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
