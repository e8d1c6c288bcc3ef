"""A result as clients receive it: its JSON (field names, units, the WebSocket event around it)
and the encoders every producer of that text shares.

Boxes are in source pixels, times Unix seconds, durations milliseconds. A result is encoded
once, by whatever makes it: the publisher thread of the process that runs its stream (a stream
worker process encodes all but the seq, which the API process's hub gives it:
`encode_result_tail`), and the API serves that text to every WebSocket client, to GET
.../detections and to the notifications. Nothing here touches streams, the hub's state or HTTP.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field

from vdet.core.types import NO_TRACK, DetectionResult, Detections, StageTimings, ZoneEvent
from vdet.results.hub import EncodedResult, HubResult


class ZoneEventOut(BaseModel):
    """A track entering or leaving a polygon zone, or crossing a line, on this result's frame."""

    type: Literal["zone_enter", "zone_exit", "line_cross"]
    zone: str = Field(description="The zone's (or line's) id.")
    track_id: int = Field(ge=1, description="The track, as in the detections' track_id.")
    class_id: int = Field(ge=0, description="The track's class on this frame.")
    class_name: str
    direction: Literal["in", "out"] | None = Field(
        default=None,
        description="line_cross only: 'in' when crossing from the left to the right of the "
        "line's first -> second point as seen on the image, else 'out'; null otherwise.",
    )
    dwell_s: float | None = Field(
        default=None,
        description="zone_exit only: seconds from the frame the track entered the zone to the "
        "last frame it was seen inside; null otherwise.",
    )


def events_out(events: Sequence[ZoneEvent], names: Sequence[str]) -> list[ZoneEventOut]:
    return [
        ZoneEventOut(
            type=e.type,
            zone=e.zone,
            track_id=e.track_id,
            class_id=e.class_id,
            class_name=names[e.class_id] if 0 <= e.class_id < len(names) else str(e.class_id),
            direction=e.direction,
            dwell_s=e.dwell_s,
        )
        for e in events
    ]


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


class ResultEvent(BaseModel):
    type: Literal["result"] = "result"
    result: DetectionResultOut


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
