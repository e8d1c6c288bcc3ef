"""The seam between the streams and everything that uses them: `StreamService`.

Streams run in this process (`LocalStreams`, vdet.streams.local) or in stream worker processes
that one `WorkerPool` forwards every call to (vdet.workers.pool); callers cannot tell which.
Writes (`StreamControl`: add, change, remove) and reads (`StreamReads`) are separate protocols,
so that what only concerns the writes wraps them alone: the streams file
(vdet.streams.persistent) writes itself after each change and forwards nothing else.

What crosses the seam (and a worker's pipe) is a frozen value: `StreamView`, `StreamChanges`,
`PictureRequest`, `EncodedFrame`. Every method may block (locks, thread joins, a worker's
reply): call it from a thread, never from the event loop.
"""

from __future__ import annotations

import builtins
import dataclasses
from collections.abc import Sequence
from typing import Literal, Protocol

from pydantic import ConfigDict, Field

from vdet.config.base import ClassRef, Strict
from vdet.config.streams import (
    ClassThresholdMap,
    ConfThreshold,
    DetectFps,
    DetectionDefaults,
    IouThreshold,
    MaxDet,
    StreamSpec,
)
from vdet.config.tracking import TrackingSpec, ZoneList
from vdet.core.contract import PostprocessParams
from vdet.core.types import Detections, ImageArray, SourceStatus, StageTimings
from vdet.streams.event_snapshots import EventSnapshot, EventSnapshotCounts, EventSnapshotInfo
from vdet.streams.params import stream_params


class StreamError(Exception):
    """Base of the errors a stream operation reports to its caller."""


class DuplicateStreamError(StreamError):
    """A stream with this id already exists."""


class LimitError(StreamError):
    """Adding the stream would exceed a limit (`max_streams`, a worker's share)."""


class UnknownStreamError(StreamError, KeyError):
    """No stream has this id."""

    def __str__(self) -> str:  # KeyError would print the repr of its argument
        return str(self.args[0]) if self.args else "unknown stream"


class StreamUnavailableError(StreamError):
    """What runs the stream is not answering now (a worker process restarting, or slower than
    the call timeout); retrying later can succeed."""


@dataclasses.dataclass(frozen=True)
class StreamView:
    """A consistent snapshot of one stream: what was asked, what runs, how it is."""

    spec: StreamSpec
    params: PostprocessParams
    status: SourceStatus
    frames_processed: int
    last_frame_age_s: float | None
    pipeline_error: str | None
    fps_processed: float | None = None  # published per second, over the last seconds
    worker: str | None = None  # the worker process running it; None: this process


def view_of_spec(
    spec: StreamSpec, defaults: DetectionDefaults, names: Sequence[str], status: SourceStatus
) -> StreamView:
    """The view of a stream that does not run here (yet): its spec, its effective parameters
    and `status` (why it does not run, or that it is starting)."""
    return StreamView(
        spec=spec,
        params=stream_params(spec, defaults, names),
        status=status,
        frames_processed=0,
        last_frame_age_s=None,
        pipeline_error=None,
    )


class StreamChanges(Strict):
    """Changes to a running stream (the body of PATCH /v1/streams/{id}). A field left out is
    kept; null resets it to the default (`classes`: all; `class_thresholds`: conf_threshold for
    all; `detect_fps`: every frame; `tracking`: the defaults; `zones`: none)."""

    model_config = ConfigDict(frozen=True)

    conf_threshold: ConfThreshold | None = None
    iou_threshold: IouThreshold | None = None
    max_det: MaxDet | None = None
    classes: list[ClassRef] | None = Field(default=None, min_length=1, max_length=1000)
    class_thresholds: ClassThresholdMap | None = Field(
        default=None,
        description="Minimum score per class (replaced whole); null: conf_threshold for all.",
    )
    detect_fps: DetectFps | None = Field(
        default=None, description="Detections per second at most; null: every frame."
    )
    tracking: TrackingSpec | None = Field(
        default=None, description="Tracker settings (replaced whole); null: the defaults."
    )
    zones: ZoneList | None = Field(
        default=None, description="All zones and lines (replaced whole); null: none."
    )

    def applied_to(self, spec: StreamSpec) -> StreamSpec:
        """`spec` with these changes, validated as a whole (pydantic's ValidationError, a
        ValueError, for a combination that is not a valid stream)."""
        merged = spec.model_dump() | self.model_dump(exclude_unset=True)
        for key in ("tracking", "zones"):  # null: back to the default
            if merged.get(key) is None:
                merged.pop(key, None)
        return StreamSpec.model_validate(merged)


Picture = tuple[int, int | None]
"""What a live frame shows: (the frame's index, the index of the frame its drawn boxes were
detected on, or None when none are drawn). Two encodes with equal pictures are the same JPEG."""


@dataclasses.dataclass(frozen=True)
class PictureRequest:
    """Which of a stream's latest frames to encode, and how (`StreamReads.picture`).

    The last processed frame, with the result detected on it; with `newest`, the newest decoded
    frame when ingest has a newer one in host memory (CPU decoding), with the newest result
    (a live view then runs at the decode rate, its boxes a detection's latency behind).
    `boxes` draws the result's detections (at source resolution, before any scaling);
    `max_width` scales the frame down, never up; `unless`: answer None instead of encoding a
    frame that would show this picture (one the caller already has).
    """

    boxes: bool = True
    quality: int = 85
    max_width: int | None = None
    newest: bool = False
    unless: Picture | None = None


@dataclasses.dataclass(frozen=True)
class EncodedFrame:
    """One frame of a stream, encoded, and the result that goes with it."""

    seq: int  # the seq of the result that goes with the frame (as the WebSocket feed has it)
    jpeg: bytes
    width: int  # of the JPEG
    height: int
    source_width: int  # of the decoded frame, the space detection boxes are in
    source_height: int
    frame_index: int = 0  # the frame's index in its stream (what a worker knows it by)
    # The frame the result was detected on: frame_index itself for a processed frame, an
    # earlier one for a newer decoded frame shown with the newest result.
    result_frame_index: int = 0
    boxes_drawn: bool = False

    @property
    def picture(self) -> Picture:
        return (self.frame_index, self.result_frame_index if self.boxes_drawn else None)


@dataclasses.dataclass(frozen=True)
class BackendInfo:
    """What serves detections: reported by `vdet_backend_info`, /readyz and the start-up log."""

    backend: str
    device: str
    model: str
    precision: str
    class_names: tuple[str, ...]
    # "gpu": NVDEC, our kernels, CUDA graphs; "cpu": CPU decode, every frame through Detector.
    data_path: Literal["gpu", "cpu"] = "cpu"
    selection: str = ""  # why this backend serves (what `auto` passed over)
    input_hw: tuple[int, int] = (640, 640)  # the network's input; uploads are decoded to it


@dataclasses.dataclass(frozen=True)
class Health:
    """Every stream's source status and every GPU's use, for one metrics scrape."""

    sources: tuple[tuple[str, SourceStatus], ...]
    gpus: tuple[tuple[str, int, int | None], ...]  # (label, streams, allocator bytes)
    event_snapshots: tuple[tuple[str, EventSnapshotCounts], ...] = ()


EventSnapshotList = tuple[builtins.list[EventSnapshotInfo], EventSnapshotCounts]


class StreamControl(Protocol):
    """Changes to which streams run and how. Each raises ValueError for what the stream's
    validation refuses (a URL the source policy refuses, an unknown class, a zone outside the
    frame), UnknownStreamError, and, for `add`, DuplicateStreamError or LimitError."""

    def add(self, spec: StreamSpec) -> StreamView: ...

    def change(self, stream_id: str, changes: StreamChanges) -> StreamView: ...

    def remove(self, stream_id: str) -> None: ...


class StreamReads(Protocol):
    """What the streams show. UnknownStreamError for an id that does not run."""

    def list(self) -> builtins.list[StreamView]:
        """Every stream, sorted by id."""
        ...

    def get(self, stream_id: str) -> StreamView: ...

    def __contains__(self, stream_id: object) -> bool:
        """Whether the stream runs: answered from memory, without waiting for a worker."""
        ...

    def picture(self, stream_id: str, request: PictureRequest) -> EncodedFrame | None:
        """One of the stream's latest frames as JPEG (`PictureRequest`); None before its first
        result, or when it would show `request.unless`."""
        ...

    def event_snapshots(self, stream_id: str) -> EventSnapshotList:
        """The stream's event snapshots kept now, oldest first, and its counts."""
        ...

    def event_snapshot(self, stream_id: str, frame_index: int) -> EventSnapshot | None:
        """A kept JPEG of a frame with events (vdet.streams.event_snapshots); None when not
        kept."""
        ...

    def detect(
        self, image_bgr: ImageArray, params: PostprocessParams
    ) -> tuple[Detections, StageTimings]:
        """Detections on one image, by the model the streams run."""
        ...


class StreamService(StreamControl, StreamReads, Protocol):
    """Where the streams run: both sides, what serves them, and the service's own upkeep."""

    @property
    def backend_info(self) -> BackendInfo: ...

    def describe(self) -> str:
        """One line for the start-up log: the backend and where the streams run."""
        ...

    def sync_metrics(self) -> None:
        """Bring every stream's counters in `Metrics` up to date (before a scrape)."""
        ...

    def close(self) -> None:
        """Stop every stream and what runs them. Idempotent."""
        ...
