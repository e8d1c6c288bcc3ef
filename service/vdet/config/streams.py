"""A stream as declared in config or POSTed to /v1/streams (`StreamSpec`), the detection
defaults of streams and uploads, and the field types both use.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StrictBool, StrictInt, StringConstraints, field_validator

from vdet.config.base import ClassRef, Strict
from vdet.config.tracking import TrackingSpec, ZoneList
from vdet.core import contract

STREAM_ID_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"


_CONF = Field(ge=0.0, le=1.0, description="Minimum class score a detection must reach.")
_IOU = Field(ge=0.0, le=1.0, description="IoU above which NMS suppresses the weaker box.")
_MAX_DET = Field(ge=1, le=10_000, description="Most detections kept per frame, best first.")
_STRICT = Field(strict=True)  # a JSON number only: no "0.5", no true

# What streams and PATCH bodies accept: JSON numbers (ints, for max_det) and nothing else.
ConfThreshold = Annotated[float, _STRICT, _CONF]
IouThreshold = Annotated[float, _STRICT, _IOU]
MaxDet = Annotated[int, _STRICT, _MAX_DET]
DetectFps = Annotated[
    float,
    _STRICT,
    Field(
        gt=0.0,
        le=1000.0,
        description="Detect on at most this many frames per second of video, evenly spaced.",
    ),
]

ClassThresholdMap = Annotated[
    dict[Annotated[str, Field(min_length=1, max_length=256)], ConfThreshold],
    Field(min_length=1, max_length=1000),
]


class StreamSpec(Strict):
    """A video source to run detection on, as declared in config or POSTed to /v1/streams.

    Threshold fields left null use the server's `detection` defaults.
    """

    id: str = Field(
        pattern=STREAM_ID_PATTERN,
        description="Unique stream id: 1-64 letters, digits, '_', '.', '-'; not '.' or '..' "
        "(they would be path segments in the stream's URLs).",
        examples=["gate-cam-1"],
    )
    url: Annotated[str, StringConstraints(strip_whitespace=True)] = Field(
        min_length=1,
        max_length=4096,
        description="Source URL: rtsp://, rtsps://, http(s):// or a local file (see errors for "
        "the schemes this server allows). Leading and trailing whitespace is dropped.",
        examples=["rtsp://camera.local:554/stream1"],
    )
    loop: StrictBool = Field(
        default=False, description="Restart a file source from the start when it ends."
    )
    realtime: StrictBool = Field(
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
    gpu: StrictInt | None = Field(
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


class DetectionDefaults(Strict):
    """Postprocessing defaults for streams and uploads that do not set their own.

    The defaults are vdet.core.contract's, as are those of the CLI and the TensorRT plugin node.
    """

    # Lax, unlike a stream's: these come from environment variables too ("0.3").
    conf_threshold: Annotated[float, _CONF] = contract.CONF_THRESHOLD
    iou_threshold: Annotated[float, _IOU] = contract.IOU_THRESHOLD
    max_det: Annotated[int, _MAX_DET] = contract.MAX_DET
    top_k: int = Field(
        default=contract.TOP_K,
        ge=1,
        le=100_000,
        description="Candidates kept by score before NMS, bounding its cost on noisy frames.",
    )
