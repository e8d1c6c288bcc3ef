"""The JSON shapes of the HTTP and WebSocket API, and conversions from core types to them.

This module owns the wire format: field names, units (boxes in source pixels, times as Unix
seconds, durations in milliseconds) and the WebSocket message envelopes. Routes return these
models; nothing here touches streams, the hub or the detector.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from vdet.config.streams import (
    StreamSpec,
)
from vdet.core.types import SourceState
from vdet.results.wire import DetectionOut, TimingsMs


class ErrorOut(BaseModel):
    """Every error response. `detail` is a sentence, or for request validation errors (422)
    FastAPI's list of issues, each with `loc`, `msg` and `type`."""

    detail: str | list[dict[str, Any]] = Field(
        description="What was wrong and, where possible, how to fix it."
    )


class DetectOut(BaseModel):
    """Detections for one uploaded image."""

    image_width: int
    image_height: int
    detections: list[DetectionOut]
    timings_ms: TimingsMs


class EffectiveParams(BaseModel):
    """The thresholds a stream runs with now, server defaults filled in."""

    conf_threshold: float
    iou_threshold: float
    max_det: int
    top_k: int
    classes: list[str] | None = Field(description="Class names reported; null: all.")
    class_thresholds: dict[str, float] | None = Field(
        default=None,
        description="Minimum score of the classes that have their own, by name; the others' is "
        "conf_threshold.",
    )


class StreamStatusOut(BaseModel):
    state: SourceState = Field(description="Where the source thread is in its cycle.")
    attempts: int = Field(description="Connection attempts since the stream was added.")
    reconnects: int = Field(description="Reopens after an error, end of stream or stall.")
    last_error: str | None = Field(
        description="The source's current problem, if any; cleared once frames flow cleanly "
        "again (earlier errors: recent_errors)."
    )
    last_error_time: float | None = Field(default=None, description="Unix time of last_error.")
    recent_errors: list[str] = Field(
        default_factory=list,
        description="The last errors, oldest first, each as '<unix time> <message>'.",
    )
    pipeline_error: str | None = Field(
        description="The last detection error; cleared by the next successful frame."
    )
    last_frame_age_s: float | None = Field(
        description="Seconds since the last decoded frame; null before the first."
    )
    fps: float | None = Field(
        description="Frames decoded per second, measured over the last 5 seconds."
    )
    fps_nominal: float | None = Field(
        default=None, description="The frame rate the source declares."
    )
    fps_processed: float | None = Field(
        default=None, description="Frames detected and published per second (last 5 s)."
    )
    width: int | None
    height: int | None
    frames_decoded: int
    frames_processed: int
    frames_dropped: int = Field(
        description="Decoded frames lost because detection was busy with an earlier one."
    )
    decode_errors: int = Field(default=0, description="Packets the decoder rejected.")
    frames_damaged: int = Field(
        default=0,
        description="Frames of damaged reference chains (after a decode error, until the "
        "next keyframe): not detected on, unless the server passes them.",
    )
    decode_path: Literal["nvdec", "cpu"] | None = Field(
        default=None,
        description="The decoder of the current sequence: nvdec (GPU) or cpu; null before the "
        "source opened.",
    )
    decode_reason: str | None = Field(
        default=None,
        description="Why a GPU node decodes this stream on the CPU (its codec, chroma format, bit "
        "depth or size, NVDEC unavailable, or gpu.decoder set to cpu); null otherwise.",
    )
    frames_skipped: int = Field(
        default=0, description="Decoded frames the stream's detect_fps left out of detection."
    )


class StreamOut(BaseModel):
    id: str
    node: str | None = Field(
        default=None,
        description="In a fleet (settings `cluster`): the node running it; null on a server "
        "that is one node, and for a stream no node runs now (`status.last_error` says why).",
    )
    worker: str | None = Field(
        default=None,
        description="The worker process running it (on its node); null: the API process.",
    )
    spec: StreamSpec = Field(description="The stream as added, with any PATCHed changes.")
    effective: EffectiveParams
    status: StreamStatusOut


class StreamListOut(BaseModel):
    streams: list[StreamOut]


class HealthOut(BaseModel):
    status: Literal["ok"] = "ok"


class ReadyOut(BaseModel):
    ready: bool
    detector_loaded: bool
    worker_processes: int = Field(
        default=0, description="Stream worker processes running; 0: streams run in-process."
    )
    mps: bool = Field(
        default=False, description="Whether the worker processes share their GPU through MPS."
    )
    sources_configured: int = Field(description="Streams declared in the configuration.")
    sources_started: int = Field(description="Of those, streams whose source threads have started.")
    sources_restored: int = Field(
        default=0,
        description="Streams started from `streams_file` that the configuration does not "
        "declare (added over the API before a restart).",
    )
    detail: str | None = None
    backend: str | None = Field(
        default=None,
        description="The inference backend serving (tensorrt, tensorrt-rtx, torch, onnxruntime); "
        "null before the detector is loaded.",
    )
    data_path: Literal["gpu", "cpu"] | None = Field(
        default=None,
        description="gpu: NVDEC decode, vdet's kernels and one CUDA graph per stream on the GPU; "
        "cpu: frames decode on the CPU and run through the detector one by one.",
    )
    backend_selection: str | None = Field(
        default=None,
        description="Why this backend serves: configured, or what `backend: auto` chose and what "
        "it passed over (e.g. TensorRT for RTX on a GPU it does not run on).",
    )
    streams_decoded_on_cpu: dict[str, int] = Field(
        default_factory=dict,
        description="How many streams a GPU node decodes on the CPU, by why (configured, "
        "unavailable, codec, format, size, pipeline); each stream's status says it in words "
        "(decode_reason). Empty on a CPU node and when NVDEC takes every stream.",
    )


# --- WebSocket messages ----------------------------------------------------------------------


class GapEvent(BaseModel):
    """Sent first when results after `requested_after` can no longer be replayed."""

    type: Literal["gap"] = "gap"
    requested_after: int
    oldest_seq: int | None = Field(description="The first seq still replayable; null if none.")


class EndEvent(BaseModel):
    """Sent last before the server closes the socket; reconnect with after=`resume_after`."""

    type: Literal["lagging", "stream_removed", "shutdown"]
    resume_after: int = Field(description="The seq of the last result sent on this socket.")


# --- conversions -----------------------------------------------------------------------------
