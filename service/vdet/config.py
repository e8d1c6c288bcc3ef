"""Service configuration: one validated `Settings`, from defaults, a YAML file and `VDET_*` env.

Precedence, highest first: keyword arguments, environment (`VDET_PORT=9000`, nested with `__`:
`VDET_DETECTION__CONF_THRESHOLD=0.4`), the YAML file (`--config` or `VDET_CONFIG`), defaults.
Unknown keys are rejected, in the file and in nested env groups, so a typo fails at startup
instead of being ignored. This module only describes and validates; it starts nothing.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from contextvars import ContextVar
from importlib.resources import files
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from vdet.core import contract
from vdet.core.types import ZoneEventType
from vdet.ingest.source_thread import IngestOptions
from vdet.ingest.urls import SourcePolicy, redact
from vdet.tracking.specs import TrackingSpec, ZoneList

CONFIG_ENV_VAR = "VDET_CONFIG"
STREAM_ID_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"
MiB = 1 << 20

# The YAML file for the Settings being built now; set by load_settings, else $VDET_CONFIG.
_config_file: ContextVar[Path | None] = ContextVar("vdet_config_file", default=None)


def default_model_path() -> Path:
    """The demo model shipped inside the package (it may be absent in a development checkout)."""
    return Path(str(files("vdet").joinpath("assets", "demo.onnx")))


def demo_cpu_int8_path() -> Path:
    """The demo model's INT8 build for ONNX Runtime on the CPU, shipped beside it (made by
    `vdet quantize --target cpu`: docs/quantization.md)."""
    return Path(str(files("vdet").joinpath("assets", "demo.cpu-int8.onnx")))


class ConfigError(ValueError):
    """The configuration is invalid; the message lists every offending key and why."""


ConfThreshold = Annotated[
    float, Field(ge=0.0, le=1.0, description="Minimum class score a detection must reach.")
]
IouThreshold = Annotated[
    float, Field(ge=0.0, le=1.0, description="IoU above which NMS suppresses the weaker box.")
]
ClassThresholdMap = Annotated[
    dict[Annotated[str, Field(min_length=1, max_length=256)], ConfThreshold],
    Field(min_length=1, max_length=1000),
]
MaxDet = Annotated[
    int, Field(ge=1, le=10_000, description="Most detections kept per frame, best first.")
]
DetectFps = Annotated[
    float,
    Field(
        gt=0.0,
        le=1000.0,
        description="Detect on at most this many frames per second of video, evenly spaced.",
    ),
]
# Strict: a JSON `false` or `1.0` is neither a name nor an id (lax parsing made false class 0).
ClassRef = Annotated[
    Annotated[str, Field(strict=True, min_length=1, max_length=256)]
    | Annotated[int, Field(strict=True)],
    Field(description="A class name from the model, or its integer id."),
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamSpec(_Strict):
    """A video source to run detection on, as declared in config or POSTed to /v1/streams.

    Threshold fields left null use the server's `detection` defaults.
    """

    id: str = Field(
        pattern=STREAM_ID_PATTERN,
        description="Unique stream id: 1-64 letters, digits, '_', '.', '-'; not '.' or '..' "
        "(they would be path segments in the stream's URLs).",
        examples=["gate-cam-1"],
    )
    url: str = Field(
        min_length=1,
        max_length=4096,
        description="Source URL: rtsp://, rtsps://, http(s):// or a local file (see errors for "
        "the schemes this server allows).",
        examples=["rtsp://camera.local:554/stream1"],
    )
    loop: bool = Field(
        default=False, description="Restart a file source from the start when it ends."
    )
    realtime: bool = Field(
        default=True,
        description="Pace file sources at their native frame rate, like a camera: frames "
        "detection cannot keep up with are dropped. False: analyse the file as fast as detection "
        "goes, every frame (none dropped). Live sources are real time anyway.",
    )
    conf_threshold: ConfThreshold | None = Field(
        default=None, description="Minimum score; null: the server default."
    )
    iou_threshold: IouThreshold | None = Field(
        default=None, description="NMS IoU threshold; null: the server default."
    )
    classes: list[ClassRef] | None = Field(
        default=None,
        min_length=1,
        max_length=1000,
        description="Only report these classes (names or ids, checked against the model when "
        "the stream is added); null: all classes.",
        examples=[["person", "car"]],
    )
    max_det: MaxDet | None = Field(
        default=None, description="Most detections per frame; null: default."
    )
    class_thresholds: ClassThresholdMap | None = Field(
        default=None,
        description="Minimum score per class (names or ids), over `conf_threshold` for the "
        "classes listed: a person at 0.5 while cars count from 0.3, say. Applied before "
        "tracking; null: `conf_threshold` for every class.",
        examples=[{"person": 0.5, "car": 0.3}],
    )
    detect_fps: DetectFps | None = Field(
        default=None,
        description="Detect on at most this many frames per second, evenly spaced by the "
        "frames' timestamps (a 30 fps camera at 10: every third frame); the others are "
        "decoded but not detected, and counted as skipped, not dropped. For cameras that need "
        "fewer detections than frames, or a machine that cannot detect every frame. Null: "
        "every frame.",
        examples=[10],
    )
    gpu: int | None = Field(
        default=None,
        ge=0,
        le=255,
        description="Run this stream on this GPU index (of `gpu.devices`); null: placed by "
        "the least-loaded policy. Ignored on the CPU.",
    )
    tracking: TrackingSpec = Field(
        default_factory=TrackingSpec,
        description="Object tracking (track ids, zone and line events); on by default.",
    )
    zones: ZoneList = Field(
        default_factory=list,
        description="Polygon zones and counting lines (needs tracking); also at "
        "/v1/streams/{id}/zones.",
    )

    @field_validator("id")
    @classmethod
    def _not_a_dot_segment(cls, value: str) -> str:
        if value in (".", ".."):
            raise ValueError("'.' and '..' are not stream ids (clients resolve them as paths)")
        return value


class DetectionDefaults(_Strict):
    """Postprocessing defaults for streams and uploads that do not set their own.

    The defaults are vdet.core.contract's, as are those of the CLI and the TensorRT plugin node.
    """

    conf_threshold: ConfThreshold = contract.CONF_THRESHOLD
    iou_threshold: IouThreshold = contract.IOU_THRESHOLD
    max_det: MaxDet = contract.MAX_DET
    top_k: int = Field(
        default=contract.TOP_K,
        ge=1,
        le=100_000,
        description="Candidates kept by score before NMS, bounding its cost on noisy frames.",
    )


def _ingest_field(name: str) -> Any:
    """A Field with the default, bounds and doc of `IngestOptions.<name>`, so the two agree."""
    spec = next(f for f in dataclasses.fields(IngestOptions) if f.name == name)
    meta = spec.metadata
    return Field(default=spec.default, ge=meta["min"], le=meta["max"], description=meta["doc"])


SourceScheme = Literal["rtsp", "rtsps", "http", "https", "file"]


class SourcePolicySettings(_Strict):
    """Which sources may be added (see vdet.ingest.urls.SourcePolicy): configured ones and
    those POSTed alike. The package's bundled demo clip is always allowed."""

    schemes: list[SourceScheme] = Field(
        default_factory=lambda: list(get_args(SourceScheme)),
        min_length=1,
        max_length=5,
        description="URL schemes a source may use ('file' also covers plain paths).",
    )
    hosts: list[Annotated[str, Field(min_length=1, max_length=253)]] | None = Field(
        default=None,
        max_length=1024,
        description="Hosts network sources may name: host names ('cam.local', "
        "'*.cams.example' for any subdomain) or IP addresses and networks ('10.0.0.0/8'). "
        "Names are matched as written, never resolved. null: any host.",
        examples=[["10.0.0.0/8", "cam.local"]],
    )
    file_roots: list[Path] = Field(
        default_factory=list,
        max_length=64,
        description="Folders whose files may be sources (symbolic links resolved). Empty: "
        "only the bundled demo clip.",
    )

    @field_validator("hosts")
    @classmethod
    def _valid_hosts(cls, value: list[str] | None) -> list[str] | None:
        SourcePolicy(hosts=tuple(value) if value is not None else None)
        return value

    def policy(self) -> SourcePolicy:
        return SourcePolicy(
            schemes=tuple(dict.fromkeys(self.schemes)),
            hosts=tuple(self.hosts) if self.hosts is not None else None,
            file_roots=tuple(self.file_roots),
        )


class IngestSettings(_Strict):
    """How source workers open, read, watch and reconnect to sources (see IngestOptions)."""

    connect_timeout_s: float = _ingest_field("connect_timeout_s")
    read_timeout_s: float = _ingest_field("read_timeout_s")
    stall_timeout_s: float = _ingest_field("stall_timeout_s")
    backoff_initial_s: float = _ingest_field("backoff_initial_s")
    backoff_max_s: float = _ingest_field("backoff_max_s")
    backoff_multiplier: float = _ingest_field("backoff_multiplier")
    jitter: float = _ingest_field("jitter")
    max_consecutive_decode_errors: int = _ingest_field("max_consecutive_decode_errors")
    unpaced_queue_frames: int = _ingest_field("unpaced_queue_frames")
    pass_damaged_frames: bool = Field(
        default=False,
        description="Detect on frames of a damaged reference chain (after a decode error, "
        "until the next keyframe) instead of dropping them. The decoder's concealment of lost "
        "data then reaches the detector, which takes some of it for objects.",
    )
    source_policy: SourcePolicySettings = Field(
        default_factory=SourcePolicySettings,
        description="Allowed schemes, hosts and file folders of sources.",
    )

    @model_validator(mode="after")
    def _backoff_order(self) -> IngestSettings:
        if self.backoff_initial_s > self.backoff_max_s:
            raise ValueError(
                f"backoff_initial_s ({self.backoff_initial_s}) must not exceed "
                f"backoff_max_s ({self.backoff_max_s})"
            )
        return self

    def options(self, *, loop_files: bool, realtime: bool) -> IngestOptions:
        """The worker options for one stream."""
        return IngestOptions(
            **self.model_dump(exclude={"source_policy"}),
            policy=self.source_policy.policy(),
            loop_files=loop_files,
            realtime=realtime,
        )


class EventSnapshotSettings(_Strict):
    """JPEGs of the frames whose results carried zone or line events
    (vdet.streams.event_snapshots)."""

    per_stream: int = Field(
        default=20,
        ge=0,
        le=1000,
        description="Event snapshots kept per stream, the newest; older ones are dropped. "
        "0: none are taken.",
    )
    max_width: int = Field(
        default=1280,
        ge=64,
        le=7680,
        description="Frames wider than this are scaled down to it (never up) before encoding.",
    )
    quality: int = Field(default=80, ge=1, le=100, description="JPEG quality.")
    queue: int = Field(
        default=4,
        ge=1,
        le=64,
        description="Event frames waiting to be encoded; an event frame beyond that gets no "
        "snapshot (counted as skipped). Each waiting frame holds its decoded picture.",
    )


class HubSettings(_Strict):
    """How many results are kept for replay and how far a WebSocket client may fall behind."""

    capacity_per_source: int = Field(
        default=256, ge=1, le=100_000, description="Results kept per stream for replay."
    )
    # Sized for a full GPU node (64 streams at 30 fps, about 2,000 results/s): the replay keeps
    # about 8 s of all streams, and a client may be about 1 s behind before it is cut off.
    capacity_total: int = Field(
        default=16384, ge=1, le=1_000_000, description="Results kept across all streams."
    )
    subscriber_queue_size: int = Field(
        default=2048,
        ge=1,
        le=100_000,
        description="Results a WebSocket client may fall behind before it is disconnected as "
        "lagging (it can resume from the replay buffer).",
    )
    send_timeout_s: float = Field(
        default=5.0,
        ge=0.1,
        le=60.0,
        description="A WebSocket message that takes longer than this to go out (the client "
        "is not reading) makes the client lagging: if it reads again within as long, it gets "
        "that message and `lagging` with its resume point, then is disconnected; if not, it "
        "is disconnected. Below uvicorn's 20 s keepalive ping timeout, which would cut it "
        "without a word.",
    )


class GpuSettings(_Strict):
    """The GPU data path: NVDEC decode, per-GPU workers, CUDA graphs, batching across sources.

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
        description="GPU indices to run workers on (one worker per GPU); null: every GPU.",
    )
    max_streams_per_gpu: int | None = Field(
        default=None, ge=1, le=1024, description="Most streams one GPU worker takes; null: no cap."
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


class LimitSettings(_Strict):
    """What one HTTP request may cost before it is refused (see vdet.api.limits).

    Checked before the body is read or parsed: a request over a limit costs a few kilobytes
    and a few microseconds of the event loop, whoever sends it.
    """

    max_json_body_bytes: int = Field(
        default=64 * 1024,
        ge=1024,
        le=16 * MiB,
        description="Largest body of the JSON endpoints (POST /v1/streams, PATCH); "
        "POST /v1/detect has max_upload_bytes instead.",
    )
    header_timeout_s: float = Field(
        default=10.0,
        ge=0.5,
        le=300.0,
        description="A connection that has not sent a complete request head this long after "
        "connecting (or after starting its next request) is closed.",
    )
    body_timeout_s: float = Field(
        default=30.0,
        ge=0.5,
        le=3600.0,
        description="The whole request body must arrive within this many seconds of the "
        "request head; else 408 and the connection is closed.",
    )
    max_concurrent_detect: int = Field(
        default=4,
        ge=1,
        le=1024,
        description="POST /v1/detect requests handled at once (bodies being received "
        "included); more get 503 with Retry-After.",
    )
    max_image_pixels: int = Field(
        default=1 << 24,
        ge=1 << 16,
        le=1 << 28,
        description="Largest image POST /v1/detect decodes (width x height, read from the "
        "header by the decoder before decoding; 16 MP by default, about 50 MB decoded).",
    )
    retry_after_s: int = Field(
        default=1, ge=1, le=3600, description="Retry-After sent with a 503 for a busy detect."
    )


class WorkerSettings(_Strict):
    """Stream worker processes: where `vdet serve` runs its streams (docs/workers.md).

    One process's threads share one Python interpreter lock, which bounds how many streams one
    process carries (about 16 real-time 1080p streams with a GPU backend, measured on an H200).
    With worker processes, the API process keeps the API, the results hub, WebSockets and
    /metrics, and each worker runs the decoding and detection of its share of the streams.
    """

    processes: Literal["auto"] | int = Field(
        default="auto",
        description="Worker processes per GPU (GPU backends), or in all (CPU). 0 runs every "
        "stream inside the API process. auto: on a GPU node, enough per GPU for that GPU's "
        "share of max_streams at streams_per_process each; on the CPU, 0.",
    )
    streams_per_process: int = Field(
        default=8,
        ge=1,
        le=256,
        description="Most streams one worker process takes (8 real-time 1080p30 streams per "
        "process held with no drops on an H200; see docs/workers.md).",
    )
    start_timeout_s: float = Field(
        default=180.0,
        ge=1.0,
        le=3600.0,
        description="How long a worker may take to load its model and report ready.",
    )
    call_timeout_s: float = Field(
        default=30.0,
        ge=0.5,
        le=600.0,
        description="How long a control call (add, change, remove, status) may wait for its "
        "worker before it fails with 503.",
    )
    restart: bool = Field(
        default=True,
        description="Restart a worker that dies and re-add its streams there; false leaves "
        "its streams failed.",
    )
    spares: int = Field(
        default=1,
        ge=0,
        le=8,
        description="Idle, fully started worker processes kept ready per GPU (in all on the "
        "CPU), so a dead worker's streams move to one at once instead of waiting for a new "
        "process to load its model. Each costs one worker process's memory (and a CUDA "
        "context on a GPU). 0 disables; none run without worker processes or with "
        "restart false.",
    )

    @field_validator("processes")
    @classmethod
    def _process_count(cls, value: Literal["auto"] | int) -> Literal["auto"] | int:
        if value != "auto" and not (isinstance(value, int) and 0 <= value <= 64):
            raise ValueError("processes must be 'auto' or a whole number from 0 to 64")
        return value


ENGINE_DIR_ENV = "ENGINE_DIR"


def default_engine_dir() -> Path:
    """$ENGINE_DIR (set by the GPU image), else the user's cache folder."""
    configured = os.environ.get(ENGINE_DIR_ENV)
    if configured:
        return Path(configured)
    cache_home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache_home) / "vdet" / "engines"


class EngineSettings(_Strict):
    """TensorRT engines: where they are cached and how `vdet engine build` builds them.

    The tensorrt backend and `vdet engine build` read the same values, so a served engine is
    the one that was built. See docs/tensorrt.md.
    """

    cache_dir: Path = Field(
        default_factory=default_engine_dir,
        description="Engine cache folder (plans and their JSON manifests). Default: "
        "$ENGINE_DIR, else ~/.cache/vdet/engines.",
    )
    plugin_library: Path | None = Field(
        default=None,
        description="libvdet_plugins.so, needed only with plugin_nms; null: $PLUGIN_DIR, then "
        "the CMake build folders of a checkout.",
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


class LiveSettings(_Strict):
    """Live video (GET /v1/streams/{id}/live.mjpeg and the web page's live view)."""

    max_viewers: int = Field(
        default=8,
        ge=0,
        le=256,
        description="Most live video responses open at once, all streams together (each one "
        "costs a JPEG encode per new frame unless another viewer of the same stream and size "
        "shares it); 0 turns live video off.",
    )
    max_fps: float = Field(
        default=15.0, gt=0.0, le=60.0, description="Highest frame rate a viewer may ask for."
    )
    jpeg_quality: int = Field(default=75, ge=20, le=95, description="JPEG quality of live frames.")
    max_width: int = Field(
        default=1280,
        ge=160,
        le=7680,
        description="Live frames wider than this are scaled down to it before encoding.",
    )
    encoder_threads: int = Field(
        default=2, ge=1, le=32, description="Threads that may encode live frames at once."
    )


class EventFilterSettings(_Strict):
    """Which zone and line events a sink gets; every filter given must hold (null: any)."""

    events: list[ZoneEventType] | None = Field(
        default=None, min_length=1, description="Only these event types; null: all."
    )
    streams: list[Annotated[str, Field(pattern=STREAM_ID_PATTERN)]] | None = Field(
        default=None, min_length=1, max_length=1024, description="Only these streams; null: all."
    )
    zones: list[Annotated[str, Field(min_length=1, max_length=64)]] | None = Field(
        default=None,
        min_length=1,
        max_length=1024,
        description="Only events of zones or lines with these ids; null: all.",
    )
    classes: list[Annotated[str, Field(min_length=1, max_length=256)]] | None = Field(
        default=None,
        min_length=1,
        max_length=1000,
        description="Only events of tracks of these classes (names, checked against the model "
        "at start); null: all.",
    )


class WebhookSettings(EventFilterSettings):
    """One HTTP endpoint that gets the zone and line events of the streams, as they happen
    (docs/notify.md: body, signature, retries)."""

    id: str = Field(
        pattern=STREAM_ID_PATTERN,
        description="The webhook's name in metrics and logs: 1-64 letters, digits, '_', '.', '-'.",
    )
    url: str = Field(
        min_length=1,
        max_length=4096,
        pattern=r"^https?://[^\s]+$",
        description="Where events are POSTed (http:// or https://); never followed elsewhere "
        "(redirects are a failed delivery).",
        examples=["https://hooks.example.com/vdet"],
    )
    tls_ca_file: Path | None = Field(
        default=None,
        description="https:// only: PEM file of the CA(s) that signed the endpoint's "
        "certificate (a site's own CA), checked instead of the system's CAs; the endpoint's "
        "name is checked either way.",
    )
    secret: SecretStr | None = Field(
        default=None,
        description="Signs each body: header X-Vdet-Signature: t=<unix time>,v1=<hex of "
        "HMAC-SHA256(secret, '<t>.<body>')>, so the receiver can check who sent it and when.",
    )
    headers: dict[Annotated[str, Field(pattern=r"^[A-Za-z0-9-]{1,64}$")], SecretStr] = Field(
        default_factory=dict,
        max_length=16,
        description="Extra request headers (an Authorization header, say); values are secrets: "
        "never logged.",
    )
    timeout_s: float = Field(
        default=5.0, gt=0.0, le=60.0, description="Longest one delivery attempt may take."
    )
    max_attempts: int = Field(
        default=5,
        ge=1,
        le=20,
        description="Attempts per delivery (connection errors, timeouts, 429 and 5xx are "
        "retried after 0.5, 1, 2, ... s, at most 30 s apart); then it counts as failed.",
    )
    max_pending: int = Field(
        default=1000,
        ge=1,
        le=100_000,
        description="Deliveries waiting while the endpoint is slow or down; beyond this the "
        "oldest waiting one is dropped (counted), so memory stays bounded.",
    )

    @model_validator(mode="after")
    def _ca_file_needs_https(self) -> WebhookSettings:
        if self.tls_ca_file is not None and not self.url.lower().startswith("https://"):
            raise ValueError("tls_ca_file is for an https:// url")
        return self

    @field_validator("headers")
    @classmethod
    def _headers_vdet_sets_itself(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        reserved = {"content-type", "content-length", "host", "x-vdet-signature"}
        if taken := sorted(name for name in value if name.lower() in reserved):
            raise ValueError(f"headers {taken} are set by vdet itself")
        return value


class MqttSettings(EventFilterSettings):
    """An MQTT broker that gets the zone and line events, and vdet's availability
    (docs/notify.md, "MQTT": topics and payloads)."""

    host: str = Field(
        min_length=1, max_length=253, pattern=r"^[A-Za-z0-9.:_-]+$", description="Broker host."
    )
    port: int = Field(default=1883, ge=1, le=65535, description="Broker port (TLS: often 8883).")
    tls: bool = Field(
        default=False,
        description="TLS to the broker, its certificate and name checked against the system's "
        "CAs or `tls_ca_file`.",
    )
    tls_ca_file: Path | None = Field(
        default=None,
        description="PEM file of the CA(s) that signed the broker's certificate (a site's own "
        "CA); implies tls.",
    )
    username: str | None = Field(default=None, min_length=1, max_length=256)
    password: SecretStr | None = Field(default=None, description="Never logged.")
    client_id: str = Field(
        default="vdet",
        pattern=r"^[A-Za-z0-9_.-]{1,64}$",
        description="The MQTT client id; unique per vdet on one broker (a second connection "
        "with the same id makes the broker drop the first).",
    )
    topic_prefix: str = Field(
        default="vdet",
        pattern=r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$",
        max_length=128,
        description="Topics start with this: <prefix>/status (online/offline, retained) and "
        "<prefix>/streams/<stream id>/events; no wildcards, no leading or trailing '/'.",
    )
    qos: Literal[0, 1, 2] = Field(
        default=1, description="QoS of event messages (1: at least once, while connected)."
    )
    keepalive_s: int = Field(default=30, ge=5, le=3600, description="MQTT keepalive.")
    max_queued: int = Field(
        default=10_000,
        ge=1,
        le=1_000_000,
        description="Event messages held while the broker is away or slow; beyond this a new "
        "one is dropped (counted).",
    )
    snapshots: bool = Field(
        default=False,
        description="Also publish the event snapshot (JPEG) of each frame whose events the "
        "filters keep to <prefix>/streams/<id>/snapshot, retained: the stream's latest event "
        "picture (a Home Assistant MQTT camera shows it). Needs event_snapshots.per_stream > 0.",
    )
    home_assistant: bool = Field(
        default=False,
        description="With snapshots: announce each stream's snapshot topic to Home Assistant "
        "(MQTT discovery, retained, before its first snapshot), so it appears as a camera "
        "without configuring it there.",
    )
    discovery_prefix: str = Field(
        default="homeassistant",
        pattern=r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$",
        max_length=128,
        description="Home Assistant's MQTT discovery prefix.",
    )

    @model_validator(mode="after")
    def _home_assistant_needs_snapshots(self) -> MqttSettings:
        if self.home_assistant and not self.snapshots:
            raise ValueError("home_assistant announces the snapshot cameras: set snapshots too")
        return self


class NotifySettings(_Strict):
    """Where zone and line events go besides the WebSocket feeds."""

    webhooks: list[WebhookSettings] = Field(
        default_factory=list, max_length=16, description="HTTP endpoints for the events."
    )
    mqtt: MqttSettings | None = Field(
        default=None, description="An MQTT broker for the events; null: none."
    )
    shutdown_grace_s: float = Field(
        default=2.0,
        ge=0.0,
        le=60.0,
        description="At shutdown, how long deliveries still waiting may take to go out before "
        "they are dropped (counted).",
    )
    public_url: str | None = Field(
        default=None,
        max_length=2048,
        pattern=r"^https?://[^\s?#]+$",
        description="The address receivers reach vdet at (behind a proxy, say): bodies then "
        "name their frame's event snapshot by a whole URL under it, not a path.",
        examples=["https://vdet.site-7.example"],
    )

    @field_validator("public_url")
    @classmethod
    def _no_trailing_slash(cls, value: str | None) -> str | None:
        return None if value is None else value.rstrip("/")

    @model_validator(mode="after")
    def _unique_ids(self) -> NotifySettings:
        ids = [hook.id for hook in self.webhooks]
        if len(ids) != len(set(ids)):
            raise ValueError(f"webhook ids must be unique, got {ids}")
        return self


class Settings(BaseSettings):
    """Everything `vdet serve` needs. See the module docstring for where values come from."""

    model_config = SettingsConfigDict(
        env_prefix="VDET_",
        env_nested_delimiter="__",
        extra="forbid",
        validate_default=True,
    )

    host: str = Field(default="127.0.0.1", min_length=1, description="Address to listen on.")
    port: int = Field(default=8000, ge=1, le=65535, description="TCP port to listen on.")
    api_key: SecretStr | None = Field(
        default=None,
        description="When set, every endpoint except /healthz, /readyz, /metrics and the web "
        "page's files (/, /ui/) requires it (X-API-Key or Authorization: Bearer; WebSockets: "
        "?api_key= or subprotocol).",
    )
    max_streams: int = Field(default=16, ge=1, le=1024, description="Most concurrent streams.")
    max_upload_bytes: int = Field(
        default=20 * MiB,
        ge=1024,
        le=1 << 30,
        description="Largest request body accepted by POST /v1/detect.",
    )
    allow_file_sources: bool = Field(
        default=True,
        description="Whether POST /v1/streams may name local files at all (those within "
        "ingest.source_policy.file_roots, or the bundled demo clip); their frames are shown "
        "in snapshots. Sources in this file are not affected by it (the policy still is).",
    )
    limits: LimitSettings = Field(
        default_factory=LimitSettings,
        description="Request body sizes, read timeouts and the /v1/detect concurrency cap.",
    )
    model_path: Path = Field(
        default_factory=default_model_path,
        description="Detection model (ONNX, raw YOLOv8 head). Default: the bundled demo model.",
    )
    backend: str = Field(
        default="auto",
        min_length=1,
        max_length=64,
        description="Inference backend kind; 'auto' picks the best one available.",
    )
    input_shape: Literal["rect", "square"] = Field(
        default="rect",
        description="rect: each frame is letterboxed into the smallest input (sides multiples of "
        "the model's stride) that holds it, 640x384 for 16:9 at 640: about 40% less network work "
        "for the same boxes, where the backend takes such inputs (a model whose height and "
        "width are dynamic, on ONNX Runtime or torch; a TensorRT engine whose profile covers "
        "them); square: always the model's input size. On the GPU path a stream's CUDA graph "
        "is captured for its shape and batches hold one shape each (docs/gpu-data-path.md).",
    )
    cpu_sessions: int | None = Field(
        default=None,
        ge=1,
        le=16,
        description="ONNX Runtime on the CPU: sessions of the model, each with its share of "
        "the cores; each stream keeps this many frames in detection at once (more frames per "
        "second, more latency per frame). null: 2 where there are 2 cores or more, else 1. "
        "Streams in the API process only; stream worker processes (`workers`) keep one "
        "session with their share of the cores.",
    )
    cpu_int8_demo: bool = Field(
        default=True,
        description="On ONNX Runtime (the CPU), run the bundled demo model as its INT8 build "
        "(demo.cpu-int8.onnx: about 1.8x the inferences per second on 2 cores, mAP50-95 "
        "0.915 against 0.918, mAP50 the same). false: the FP32 model. A model of your own is "
        "never swapped: quantize it with `vdet quantize --target cpu` and set model_path.",
    )
    detection: DetectionDefaults = Field(
        default_factory=DetectionDefaults, description="Postprocessing defaults."
    )
    ingest: IngestSettings = Field(
        default_factory=IngestSettings, description="Source reading and reconnects."
    )
    hub: HubSettings = Field(default_factory=HubSettings, description="Result replay buffers.")
    event_snapshots: EventSnapshotSettings = Field(
        default_factory=EventSnapshotSettings,
        description="JPEGs of the frames with zone and line events, per stream.",
    )
    engine: EngineSettings = Field(
        default_factory=EngineSettings,
        description="TensorRT engines (the tensorrt backend and `vdet engine build`).",
    )
    gpu: GpuSettings = Field(
        default_factory=GpuSettings,
        description="NVDEC decode, per-GPU workers, CUDA graphs and batching (GPU backends).",
    )
    workers: WorkerSettings = Field(
        default_factory=WorkerSettings,
        description="Stream worker processes behind the one API (see docs/workers.md).",
    )
    live: LiveSettings = Field(
        default_factory=LiveSettings, description="Live video for the web page and viewers."
    )
    sources: list[StreamSpec] = Field(
        default_factory=list,
        max_length=1024,
        description="Streams added at start-up.",
    )
    notify: NotifySettings = Field(
        default_factory=NotifySettings,
        description="Webhooks for zone and line events (docs/notify.md).",
    )
    streams_file: Path | None = Field(
        default=None,
        description="A JSON file where the streams are kept as the API leaves them (added, "
        "changed, zones, removed) and started again at the next start; written in one step "
        "after each change, readable by its owner only (source URLs carry credentials). A "
        "configured source keeps its API changes until its entry in the config file is "
        "edited. null: what the API changes lasts until the service stops.",
        examples=["/var/lib/vdet/streams.json"],
    )
    log_level: Literal["debug", "info", "warning", "error", "critical"] = Field(
        default="info", description="Log level for vdet and uvicorn."
    )

    @field_validator("api_key")
    @classmethod
    def _api_key_long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < 8:
            raise ValueError("api_key must be at least 8 characters")
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        config_file = _config_file.get() or os.environ.get(CONFIG_ENV_VAR)
        if not config_file:
            return init_settings, env_settings
        return (
            init_settings,
            env_settings,
            YamlConfigSettingsSource(settings_cls, yaml_file=config_file),
        )


def load_settings(config_file: str | os.PathLike[str] | None = None, **overrides: Any) -> Settings:
    """Build Settings from `config_file` (else $VDET_CONFIG), the environment and `overrides`.

    Raises ConfigError with one line per problem (key path and reason, plus the file name) for
    a missing or unreadable file, unknown keys and out-of-range values.
    """
    _check_env_names(os.environ)
    path = Path(config_file) if config_file is not None else None
    if path is None and os.environ.get(CONFIG_ENV_VAR):
        path = Path(os.environ[CONFIG_ENV_VAR])
    if path is not None and not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    token = _config_file.set(path)
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, path)) from None
    except (ValueError, TypeError, OSError, yaml.YAMLError) as exc:
        # YAML syntax errors, a file whose top level is not a mapping, an unreadable file.
        raise ConfigError(f"cannot read config file {path}: {exc}") from None
    finally:
        _config_file.reset(token)


# VDET_* variables that vdet reads itself, outside Settings: accepted next to the settings.
OTHER_ENV_VARS: frozenset[str] = frozenset(
    {
        CONFIG_ENV_VAR,
        "VDET_KERNEL_CACHE",  # compiled CUDA kernels (vdet.cuda.launch)
    }
)


def _check_env_names(environ: Mapping[str, str]) -> None:
    """Reject VDET_* variables that name no setting: a typo must not be silently ignored."""
    known = {name.upper() for name in Settings.model_fields} | {v[5:] for v in OTHER_ENV_VARS}
    unknown = sorted(
        name
        for name in environ
        if name.upper().startswith("VDET_") and name[5:].upper().split("__")[0] not in known
    )
    if unknown:
        raise ConfigError(
            f"unknown environment variable(s) {', '.join(unknown)}; settings are "
            f"{', '.join(sorted('VDET_' + k for k in known))} (nested keys with '__')"
        )


def _describe(exc: ValidationError, path: Path | None) -> str:
    where = f" (config file {path}; environment VDET_*)" if path else " (environment VDET_*)"
    lines = [f"invalid configuration{where}:"]
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "<root>"
        if err["type"] == "extra_forbidden":
            lines.append(f"  {key}: unknown key")
        elif "api_key" in key:  # never echo a secret
            lines.append(f"  {key}: {err['msg']}")
        else:
            lines.append(f"  {key}: {err['msg']} (got {redact(repr(err.get('input')))})")
    return "\n".join(lines)
