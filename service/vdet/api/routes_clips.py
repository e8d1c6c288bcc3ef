"""Event clips over REST: list a stream's clips with their events and times, download one (HTTP
range requests answered, so that a browser can seek), delete one. The clips are read from the
clips folder (vdet.clips.store), whichever process of this node wrote them; a stream's clips
stay listed after the stream is removed, until the folder's limits delete them."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Response, status
from fastapi.responses import FileResponse
from pydantic import BaseModel, Field

from vdet.api.deps import ServiceDep, StreamsDep
from vdet.api.schemas import ErrorOut
from vdet.clips.store import CLIP_ID_PATTERN, MEDIA_TYPE, ClipStore, clip_path
from vdet.config.streams import STREAM_ID_PATTERN

router = APIRouter(prefix="/v1/streams/{stream_id}/clips", tags=["streams"])

_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorOut, "description": "Clips are off (clips.folder), or no such clip."}
}
StreamId = Annotated[str, Path(pattern=STREAM_ID_PATTERN)]
ClipId = Annotated[str, Path(pattern=CLIP_ID_PATTERN, description="As listed.")]


class ClipEventOut(BaseModel):
    type: str
    zone: str
    class_name: str
    track_id: int
    time: float = Field(description="Unix time of the event's frame.")
    direction: str | None = None


class ClipOut(BaseModel):
    clip_id: str
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


class ClipsOut(BaseModel):
    clips: list[ClipOut] = Field(description="Oldest first.")
    kept_clips: int = Field(description="Clips kept now, all streams.")
    kept_bytes: int = Field(description="Their size; at most clips.max_total_bytes.")
    failed: dict[str, int] = Field(
        description="This stream's clips not written since the start, by reason: disk_full, "
        "permission, busy (the writer was behind), error (the log says more). Counted by the "
        "process that runs the stream: streams in worker processes show none here yet."
    )


def _store(service: Any) -> ClipStore:
    store = ClipStore.of(service.settings.clips)
    if store is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail="clips are off (clips.folder)")
    return store


@router.get("", response_model=ClipsOut, summary="A stream's event clips", responses=_NOT_FOUND)
def list_clips(stream_id: StreamId, service: ServiceDep, streams: StreamsDep) -> ClipsOut:
    store = _store(service)
    infos = store.clips(stream_id)
    if not infos and stream_id not in {view.spec.id for view in streams.list()}:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no stream {stream_id!r}")
    kept, size = store.usage()
    service.metrics.clips_disk_bytes.set(size)
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
            )
            for i in infos
        ],
        kept_clips=kept,
        kept_bytes=size,
        failed=_failures(service, stream_id),
    )


def _failures(service: Any, stream_id: str) -> dict[str, int]:
    failed: dict[str, int] = {}
    for metric in service.metrics.clips.collect():
        for sample in metric.samples:
            labels, outcome = sample.labels, sample.labels.get("outcome", "written")
            ours = sample.name.endswith("_total") and labels.get("source") == stream_id
            if ours and outcome != "written":
                failed[outcome] = int(sample.value)
    return failed


@router.get(
    "/{clip_id}",
    summary="One clip's video (range requests answered)",
    response_class=FileResponse,
    responses={
        200: {"content": {"video/mp4": {}, "video/x-matroska": {}}},
        206: {"description": "The part a Range header asked for."},
        **_NOT_FOUND,
    },
)
def get_clip(stream_id: StreamId, clip_id: ClipId, service: ServiceDep) -> Response:
    found = _store(service).get(stream_id, clip_id)
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no clip {clip_id!r}")
    _, path = found
    return FileResponse(
        path,
        media_type=MEDIA_TYPE.get(path.suffix, "video/mp4"),
        filename=f"{stream_id}-{path.name}",
        content_disposition_type="inline",
    )


@router.delete("/{clip_id}", status_code=204, summary="Delete one clip", responses=_NOT_FOUND)
def delete_clip(stream_id: StreamId, clip_id: ClipId, service: ServiceDep) -> Response:
    if not _store(service).delete(stream_id, clip_id):
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no clip {clip_id!r}")
    return Response(status_code=204)
