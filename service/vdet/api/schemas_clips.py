"""Event clips as the API shows them (GET /v1/streams/{id}/clips): the listing's schema, and the
listing of one clips folder (vdet.clips.store), made on the node whose disk keeps the clips
(vdet.api.routes_clips; in a fleet, asked of every node through vdet.api.fleet_clips)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from vdet.clips.store import CLIP_ID_PATTERN, MEDIA_TYPE, ClipStore, clip_path
from vdet.metrics.registry import Metrics


class ClipEventOut(BaseModel):
    type: str
    zone: str
    class_name: str
    track_id: int
    time: float = Field(description="Unix time of the event's frame.")
    direction: str | None = None


class ClipOut(BaseModel):
    clip_id: str = Field(pattern=CLIP_ID_PATTERN)
    source_id: str
    url: str = Field(description="Where the video is (relative to the service).")
    media_type: str = Field(description="video/mp4, or video/x-matroska for other codecs.")
    start_time: float = Field(description="Unix time its first frame arrived (a keyframe).")
    end_time: float
    duration_s: float = Field(description="By the video's own timestamps.")
    frames: int
    bytes: int
    codec: str
    events: list[ClipEventOut] = Field(description="The events it was recorded for.")
    node: str | None = Field(
        default=None,
        description="In a fleet (settings `cluster`): the node whose disk keeps the clip, the "
        "one that ran the stream when it was recorded. Any node serves it.",
    )


class ClipsOut(BaseModel):
    clips: list[ClipOut] = Field(description="Oldest first.")
    kept_clips: int = Field(
        description="Clips kept now, all streams (in a fleet: on the nodes that answered)."
    )
    kept_bytes: int = Field(description="Their size; at most clips.max_total_bytes a node.")
    failed: dict[str, int] = Field(
        description="This stream's clips not written since the start, by reason: disk_full, "
        "permission, busy (the writer was behind), error (the log says more). Counted by the "
        "process that runs the stream: streams in worker processes show none here yet."
    )
    unanswered: list[str] = Field(
        default_factory=list,
        description="In a fleet: the nodes that did not answer in time; clips on their disks "
        "are missing from this listing.",
    )


def clips_out(store: ClipStore, stream_id: str, metrics: Metrics, node: str | None) -> ClipsOut:
    """The stream's clips in `store` (this node's clips folder), with its failure counts."""
    kept, size = store.usage()
    metrics.clips_disk_bytes.set(size)
    return ClipsOut(
        clips=[
            ClipOut(
                clip_id=i.clip_id,
                source_id=i.source_id,
                url=clip_path(i.source_id, i.clip_id),
                media_type=MEDIA_TYPE.get(i.file[i.file.rfind(".") :], "video/mp4"),
                start_time=i.start_time,
                end_time=i.end_time,
                duration_s=i.duration_s,
                frames=i.frames,
                bytes=i.bytes,
                codec=i.codec,
                events=[ClipEventOut(**vars(e)) for e in i.events],
                node=node,
            )
            for i in store.clips(stream_id)
        ],
        kept_clips=kept,
        kept_bytes=size,
        failed=_failures(metrics, stream_id),
    )


def _failures(metrics: Metrics, stream_id: str) -> dict[str, int]:
    failed: dict[str, int] = {}
    for metric in metrics.clips.collect():
        for sample in metric.samples:
            labels, outcome = sample.labels, sample.labels.get("outcome", "written")
            ours = sample.name.endswith("_total") and labels.get("source") == stream_id
            if ours and outcome != "written":
                failed[outcome] = int(sample.value)
    return failed
