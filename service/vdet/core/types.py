"""Core value types that travel through the pipeline.

Data flows one way: source -> decode -> preprocess -> infer -> postprocess -> results hub -> API.
Every stage hands the next one of the types below; none of them holds a reference back to the
stage that made it. Arrays are validated once, here, so later stages can trust their shapes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int32]
ImageArray = npt.NDArray[np.uint8]


# `Detections.tracker_id` of a detection that is on no confirmed track.
NO_TRACK = -1


@dataclass(frozen=True)
class Detections:
    """Boxes of one image in source pixels, xyxy, best score first.

    `tracker_id` is set by a stream's tracker (vdet.tracking): the id of each detection's
    track, or NO_TRACK (-1); None where no tracker ran (uploads, streams with tracking off).
    """

    xyxy: FloatArray
    scores: FloatArray
    class_ids: IntArray
    tracker_id: IntArray | None = None

    def __post_init__(self) -> None:
        n = len(self.scores)
        if self.xyxy.shape != (n, 4):
            raise ValueError(f"xyxy must have shape ({n}, 4), got {self.xyxy.shape}")
        if self.scores.shape != (n,):
            raise ValueError(f"scores must have shape ({n},), got {self.scores.shape}")
        if self.class_ids.shape != (n,):
            raise ValueError(f"class_ids must have shape ({n},), got {self.class_ids.shape}")
        if self.tracker_id is not None and self.tracker_id.shape != (n,):
            raise ValueError(f"tracker_id must have shape ({n},), got {self.tracker_id.shape}")

    def __reduce__(self) -> tuple[object, ...]:
        # Pickled (down a worker's pipe, once per frame) as one buffer and the arrays' dtypes
        # and lengths: numpy pickles each array with its dtype's own reconstruction, and four
        # of those cost several times what the whole rest of a result does to unpickle.
        arrays = (self.xyxy, self.scores, self.class_ids, self.tracker_id)
        layout = tuple(None if a is None else a.dtype.str for a in arrays)
        blob = bytearray(b"".join(a.tobytes() for a in arrays if a is not None))
        return (_detections_from_buffer, (len(self.scores), layout, blob))

    @classmethod
    def empty(cls) -> Detections:
        return cls(
            xyxy=np.zeros((0, 4), np.float32),
            scores=np.zeros((0,), np.float32),
            class_ids=np.zeros((0,), np.int32),
        )

    def __len__(self) -> int:
        return len(self.scores)

    def select(self, keep: npt.NDArray[np.bool_] | npt.NDArray[np.intp]) -> Detections:
        tracker_id = None if self.tracker_id is None else self.tracker_id[keep]
        return Detections(self.xyxy[keep], self.scores[keep], self.class_ids[keep], tracker_id)


def _detections_from_buffer(n: int, layout: tuple[str | None, ...], blob: bytearray) -> Detections:
    """The inverse of `Detections.__reduce__`: views of one (writable) buffer."""
    xyxy_dtype, scores_dtype, class_dtype, tracker_dtype = layout
    xyxy = np.frombuffer(blob, xyxy_dtype, 4 * n, 0)
    scores = np.frombuffer(blob, scores_dtype, n, xyxy.nbytes)
    at = xyxy.nbytes + scores.nbytes
    class_ids = np.frombuffer(blob, class_dtype, n, at)
    tracker_id = None
    if tracker_dtype is not None:
        tracker_id = np.frombuffer(blob, tracker_dtype, n, at + class_ids.nbytes)
    return Detections(xyxy.reshape(n, 4), scores, class_ids, tracker_id)


class ColourMatrix(enum.StrEnum):
    """The YCbCr -> RGB matrix a stream declares (H.264/HEVC VUI `matrix_coefficients`)."""

    BT601 = "bt601"
    BT709 = "bt709"


class ColourRange(enum.StrEnum):
    """Whether 8-bit luma spans 16..235 (limited, "MPEG", "tv") or 0..255 (full, "JPEG", "pc")."""

    LIMITED = "limited"
    FULL = "full"


@dataclass(frozen=True)
class VideoFrame:
    """One decoded frame as it leaves ingest.

    `pts_seconds` is the stream's presentation time (None when the container has none);
    `arrival_time` is the wall clock (time.time()) when the packet that completed the frame was
    read, the start of the end-to-end latency that metrics report.
    """

    source_id: str
    index: int
    image_bgr: ImageArray
    pts_seconds: float | None
    arrival_time: float
    decode_seconds: float

    def __post_init__(self) -> None:
        img = self.image_bgr
        if img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3:
            raise ValueError(f"image_bgr must be HxWx3 uint8, got {img.shape} {img.dtype}")

    @property
    def size_wh(self) -> tuple[int, int]:
        return int(self.image_bgr.shape[1]), int(self.image_bgr.shape[0])


class DecodedFrame(Protocol):
    """What ingest hands to the pipeline: a `VideoFrame` (BGR in host memory) or, from NVDEC,
    a vdet.ingest.nvdec.GpuVideoFrame (NV12 in GPU memory). Times as in `VideoFrame`."""

    @property
    def source_id(self) -> str: ...

    @property
    def index(self) -> int: ...

    @property
    def pts_seconds(self) -> float | None: ...

    @property
    def arrival_time(self) -> float: ...

    @property
    def decode_seconds(self) -> float: ...

    @property
    def size_wh(self) -> tuple[int, int]: ...


@dataclass(frozen=True)
class StageTimings:
    """Seconds spent in each stage for one frame; end_to_end runs from arrival to publish."""

    decode: float = 0.0
    preprocess: float = 0.0
    inference: float = 0.0
    postprocess: float = 0.0
    end_to_end: float = 0.0


ZoneEventType = Literal["zone_enter", "zone_exit", "line_cross"]
CrossDirection = Literal["in", "out"]


@dataclass(frozen=True)
class ZoneEvent:
    """A track entering or leaving a polygon zone, or crossing a line, on one frame.

    `direction` is set on line_cross only ("in": from the left to the right of the line's
    first -> second point, as seen on the image); `dwell_s` on zone_exit only (seconds from
    the frame the track entered to the last frame it was seen inside).
    """

    type: ZoneEventType
    zone: str
    track_id: int
    class_id: int
    direction: CrossDirection | None = None
    dwell_s: float | None = None


@dataclass(frozen=True)
class ZoneOccupancy:
    """How many tracks of one class are inside one polygon zone now."""

    zone: str
    class_id: int
    objects: int


@dataclass(frozen=True)
class TrackingSummary:
    """What a stream's tracker adds to one frame's result, besides track ids and events.

    `occupancy` covers every (zone, class) seen in a zone since the zone was set, zeros
    included, so that a (zone, class) missing from it is of a zone deleted or redrawn.
    """

    tracks_started: tuple[int, ...] = ()  # the class id of each track confirmed on this frame
    occupancy: tuple[ZoneOccupancy, ...] = ()


@dataclass(frozen=True)
class DetectionResult:
    """What the results hub stores and the API serves for one processed frame.

    `events` and `tracking` come from the stream's tracker (empty / None without one); events
    ride on the result of the frame that caused them and so share its seq.
    """

    source_id: str
    frame_index: int
    pts_seconds: float | None
    arrival_time: float
    published_time: float
    image_size_wh: tuple[int, int]
    detections: Detections
    timings: StageTimings
    seq: int = 0  # assigned by the results hub, strictly increasing across all sources
    events: tuple[ZoneEvent, ...] = ()
    tracking: TrackingSummary | None = None
    # The result's wire text after its seq, when the process that made the result encoded it
    # ahead (a stream worker process does: the API process then never encodes frame results,
    # it only puts the hub's seq in front). Opaque here; vdet.api.schemas writes and reads it.
    encoded_tail: str | None = field(default=None, repr=False, compare=False)


class SourceState(enum.StrEnum):
    """Where a source's supervised worker is in its reconnect cycle."""

    CONNECTING = "connecting"
    STREAMING = "streaming"
    STALLED = "stalled"
    FAILED = "failed"
    BACKOFF = "backoff"
    STOPPED = "stopped"


@dataclass
class SourceStatus:
    """A snapshot of one source's health, readable by the API and metrics."""

    state: SourceState = SourceState.CONNECTING
    attempts: int = 0
    reconnects: int = 0
    # The current problem, if any: cleared once frames flow cleanly again (a reconnect, or an
    # intact keyframe after damaged frames); every error stays in `recent_errors`.
    last_error: str | None = None
    last_error_time: float | None = None
    last_frame_time: float | None = None
    frames_decoded: int = 0
    frames_dropped: int = 0
    decode_errors: int = 0  # packets the decoder rejected
    frames_damaged: int = 0  # frames of damaged reference chains (dropped unless passed)
    frames_skipped: int = 0  # decoded frames the stream's detect_fps left out of detection
    width: int | None = None
    height: int | None = None
    fps: float | None = None  # decoded frames per second, measured over the last seconds
    fps_nominal: float | None = None  # the rate the container or stream declares
    # Which decoder takes the current sequence ("nvdec" or "cpu"; None before the source
    # opened) and, when a GPU node decodes it on the CPU, why (vdet.ingest.decode_choice).
    decode_path: str | None = None
    decode_reason: str | None = None
    decode_reason_label: str = "none"
    history: list[str] = field(default_factory=list)
    recent_errors: list[str] = field(default_factory=list)  # "unix-time message", oldest first
