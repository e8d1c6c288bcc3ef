"""The JSON shapes of the HTTP and WebSocket API, and conversions from core types to them.

This module owns the wire format: field names, units (boxes in source pixels, times as Unix
seconds, durations in milliseconds) and the WebSocket message envelopes. Routes return these
models; nothing here touches streams, the hub or the detector.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from vdet.api.schemas_tracking import ZoneEventOut, events_out
from vdet.config.streams import (
    ClassRef,
    ClassThresholdMap,
    ConfThreshold,
    DetectFps,
    IouThreshold,
    MaxDet,
    StreamSpec,
)
from vdet.core.types import NO_TRACK, DetectionResult, Detections, SourceState, StageTimings
from vdet.results.hub import EncodedResult, HubResult
from vdet.tracking.specs import TrackingSpec, ZoneList


class ErrorOut(BaseModel):
    """Every error response. `detail` is a sentence, or for request validation errors (422)
    FastAPI's list of issues, each with `loc`, `msg` and `type`."""

    detail: str | list[dict[str, Any]] = Field(
        description="What was wrong and, where possible, how to fix it."
    )


class DetectionOut(BaseModel):
    class_id: int = Field(ge=0, description="Class index in the model.")
    class_name: str = Field(description="Class name from the model's metadata.")
    score: float = Field(ge=0.0, le=1.0, description="Confidence of the class.")
    box: tuple[float, float, float, float] = Field(
        description="[x1, y1, x2, y2] in source-image pixels (x2, y2 exclusive)."
    )
    track_id: int | None = Field(
        default=None,
        description="Streams with tracking: the object's track id, stable across frames while "
        "the tracker follows it (ids start at 1 per stream); null for a detection on no "
        "confirmed track, for uploads and for streams with tracking off.",
    )


class TimingsMs(BaseModel):
    """Milliseconds per stage for one frame."""

    decode: float = Field(
        description="Streams: demux + decode + colour conversion. Uploads: image decode."
    )
    preprocess: float = Field(description="Letterbox and normalisation.")
    inference: float = Field(description="The model call (its whole batch).")
    postprocess: float = Field(description="Box decoding and NMS.")
    end_to_end: float = Field(
        description="Streams: packet arrival to publish. Uploads: body received to response."
    )


class DetectionResultOut(BaseModel):
    """Detections for one processed frame of a stream."""

    seq: int = Field(ge=1, description="Global, strictly increasing result number (resume key).")
    source_id: str
    frame_index: int = Field(ge=0, description="Index of the frame in its source's decode order.")
    pts_s: float | None = Field(description="Presentation time in the stream, seconds.")
    arrival_time: float = Field(description="Unix time the frame's last packet was read.")
    published_time: float = Field(description="Unix time the result was published.")
    image_width: int
    image_height: int
    detections: list[DetectionOut]
    events: list[ZoneEventOut] = Field(
        default_factory=list,
        description="Zone and line events this frame caused (zone_enter, zone_exit, "
        "line_cross), in zone order; they share the result's seq.",
    )
    timings_ms: TimingsMs


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
    state: SourceState = Field(description="Where the source's worker is in its cycle.")
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
    frames_skipped: int = Field(
        default=0, description="Decoded frames the stream's detect_fps left out of detection."
    )


class StreamOut(BaseModel):
    id: str
    worker: str | None = Field(
        default=None, description="The worker process running it; null: the API process."
    )
    spec: StreamSpec = Field(description="The stream as added, with any PATCHed changes.")
    effective: EffectiveParams
    status: StreamStatusOut


class StreamListOut(BaseModel):
    streams: list[StreamOut]


class StreamPatch(BaseModel):
    """Changes to a running stream. A field left out is kept; null resets it to the default
    (for `classes`: report all classes)."""

    model_config = ConfigDict(extra="forbid")

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
    sources_started: int = Field(description="Of those, streams whose workers have started.")
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


# --- WebSocket messages ----------------------------------------------------------------------


class ResultEvent(BaseModel):
    type: Literal["result"] = "result"
    result: DetectionResultOut


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


def detections_out(dets: Detections, names: Sequence[str]) -> list[DetectionOut]:
    xyxy, scores, ids = dets.xyxy.tolist(), dets.scores.tolist(), dets.class_ids.tolist()
    tracks: list[int | None] = (
        [None] * len(ids)
        if dets.tracker_id is None
        else [None if t == NO_TRACK else t for t in dets.tracker_id.tolist()]
    )
    return [
        DetectionOut(
            class_id=cid,
            class_name=names[cid] if 0 <= cid < len(names) else str(cid),
            score=score,
            box=(box[0], box[1], box[2], box[3]),
            track_id=track,
        )
        for box, score, cid, track in zip(xyxy, scores, ids, tracks, strict=True)
    ]


def timings_out(t: StageTimings) -> TimingsMs:
    return TimingsMs(
        decode=t.decode * 1e3,
        preprocess=t.preprocess * 1e3,
        inference=t.inference * 1e3,
        postprocess=t.postprocess * 1e3,
        end_to_end=t.end_to_end * 1e3,
    )


def result_out(result: DetectionResult, names: Sequence[str]) -> DetectionResultOut:
    w, h = result.image_size_wh
    return DetectionResultOut(
        seq=result.seq,
        source_id=result.source_id,
        frame_index=result.frame_index,
        pts_s=result.pts_seconds,
        arrival_time=result.arrival_time,
        published_time=result.published_time,
        image_width=w,
        image_height=h,
        detections=detections_out(result.detections, names),
        events=events_out(result.events, names),
        timings_ms=timings_out(result.timings),
    )


# Every result event's text starts with this, then the seq: `ResultEvent` serialises `type`
# first and `DetectionResultOut` serialises `seq` first (pydantic keeps field order).
_RESULT_EVENT_HEAD = '{"type":"result","result":{"seq":'


def encode_result_tail(result: DetectionResult, names: Sequence[str]) -> str:
    """The `ResultEvent` text of `result` after its seq, for `DetectionResult.encoded_tail`:
    what a process that makes results (a stream worker) encodes before the hub numbers them."""
    event = ResultEvent(result=result_out(dataclasses.replace(result, seq=1), names))
    encoded = event.model_dump_json()
    head = _RESULT_EVENT_HEAD + "1"
    if not encoded.startswith(head):  # a schema change broke the field order: fail loudly
        raise AssertionError(f"result event text starts {encoded[:40]!r}, not {head!r}")
    return encoded[len(head) :]


def result_text(encoded: EncodedResult) -> str:
    """The `DetectionResultOut` JSON of a result that arrived encoded: its event text without
    the event around it. Equal, as JSON, to what `result_out` gives for the whole result."""
    tail = encoded.encoded_tail
    if not tail.endswith("}}"):  # the event's last field is `result`: fail loudly otherwise
        raise AssertionError(f"result event text ends {tail[-40:]!r}, not with the result")
    return f'{{"seq":{encoded.seq}{tail[:-1]}'


# What an encoded result without events holds (`DetectionResultOut`'s field order): class
# names are JSON strings, so their quotes are escaped and cannot fake it.
_NO_EVENTS = '"events":[],"timings_ms":'


def result_with_events(result: HubResult, names: Sequence[str]) -> dict[str, Any] | None:
    """`result` as its `DetectionResultOut` JSON object without `detections` and `timings_ms`,
    or None when its frame caused no zone event. Cheap for the many results without events: an
    encoded one (from a worker process) is parsed only when its text holds events."""
    if isinstance(result, EncodedResult) or result.encoded_tail is not None:
        tail = result.encoded_tail
        assert tail is not None
        if _NO_EVENTS in tail:
            return None
        text = result_text(EncodedResult(result.seq, result.source_id, result.frame_index, tail))
        body: dict[str, Any] = json.loads(text)
    else:
        if not result.events:
            return None
        body = result_out(result, names).model_dump(mode="json")
    body.pop("detections", None)
    body.pop("timings_ms", None)
    return body


class ResultEventEncoder:
    """JSON text of `ResultEvent`s, cached by seq: every WebSocket client of a result shares one
    encoding. Thread-safe: the thread that publishes a result encodes it ahead (while anyone
    subscribes, see `create_app`), so the event loop only looks the text up. A result that
    arrives encoded (`encoded_tail`, from a worker process) only gets its seq put in front.
    Replays older than the cache are encoded off the event loop (`encode_many`)."""

    def __init__(self, capacity: int = 16384) -> None:
        self._capacity = capacity
        self._cache: OrderedDict[int, str] = OrderedDict()
        self._lock = threading.Lock()

    def encode(self, result: HubResult, names: Sequence[str]) -> str:
        if isinstance(result, EncodedResult) or result.encoded_tail is not None:
            return f"{_RESULT_EVENT_HEAD}{result.seq}{result.encoded_tail}"
        with self._lock:
            text = self._cache.get(result.seq)
        if text is None:
            text = ResultEvent(result=result_out(result, names)).model_dump_json()
            with self._lock:
                self._cache[result.seq] = text
                if len(self._cache) > self._capacity:
                    self._cache.popitem(last=False)
        return text

    def encode_many(self, results: Sequence[HubResult], names: Sequence[str]) -> list[str]:
        return [self.encode(result, names) for result in results]
