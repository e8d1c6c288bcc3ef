"""Event snapshots over REST: GET /v1/streams/{id}/snapshots lists the JPEGs kept of a stream's
frames with zone and line events (vdet.streams.event_snapshots), GET
/v1/streams/{id}/snapshots/{frame_index}.jpg answers one. The webhook and MQTT bodies name the
second by `snapshot_path` (vdet.streams.event_snapshots)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Path, Response, status
from pydantic import BaseModel, Field

from vdet.api.deps import StreamsDep
from vdet.api.schemas import ErrorOut
from vdet.results.wire import ZoneEventOut, events_out
from vdet.streams.event_snapshots import snapshot_path

router = APIRouter(prefix="/v1/streams", tags=["streams"])


class EventSnapshotOut(BaseModel):
    frame_index: int = Field(description="The frame's index in its stream, as in its result.")
    pts_s: float | None = Field(description="Presentation time in the stream, seconds.")
    arrival_time: float = Field(description="Unix time the frame's last packet was read.")
    events: list[ZoneEventOut] = Field(description="The frame's zone and line events.")
    width: int = Field(description="Of the JPEG (frames wider than max_width are scaled).")
    height: int
    bytes: int = Field(description="Size of the JPEG.")
    url: str = Field(description="Where the JPEG is (relative to the service).")


class EventSnapshotsOut(BaseModel):
    snapshots: list[EventSnapshotOut] = Field(
        description="Kept now, oldest first: the newest `event_snapshots.per_stream`."
    )
    kept: int = Field(description="Snapshots taken since the stream started.")
    skipped: int = Field(
        description="Frames with events that got no snapshot: too many waited to be encoded."
    )
    failed: int = Field(description="Snapshots that could not be encoded (see the log).")


_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorOut, "description": "No such stream, or no snapshot of that frame."}
}


@router.get(
    "/{stream_id}/snapshots",
    response_model=EventSnapshotsOut,
    summary="The JPEGs kept of the stream's frames with zone and line events",
    responses=_NOT_FOUND,
)
def list_snapshots(stream_id: str, streams: StreamsDep) -> EventSnapshotsOut:
    infos, counts = streams.event_snapshots(stream_id)
    names = streams.backend_info.class_names
    return EventSnapshotsOut(
        snapshots=[
            EventSnapshotOut(
                frame_index=info.frame_index,
                pts_s=info.pts_seconds,
                arrival_time=info.arrival_time,
                events=events_out(info.events, names),
                width=info.width,
                height=info.height,
                bytes=info.jpeg_bytes,
                url=snapshot_path(stream_id, info.frame_index),
            )
            for info in infos
        ],
        kept=counts.kept,
        skipped=counts.skipped,
        failed=counts.failed,
    )


@router.get(
    "/{stream_id}/snapshots/{frame_index}.jpg",
    response_class=Response,
    summary="The JPEG of a frame with events, its boxes drawn",
    responses={
        200: {
            "content": {"image/jpeg": {"schema": {"type": "string", "format": "binary"}}},
            "description": "JPEG; header X-Vdet-Frame-Index gives the frame.",
        },
        **_NOT_FOUND,
    },
)
def get_snapshot(
    stream_id: str, streams: StreamsDep, frame_index: int = Path(ge=0, le=2**53)
) -> Response:
    snapshot = streams.event_snapshot(stream_id, frame_index)
    if snapshot is None:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            f"no snapshot of frame {frame_index} of stream {stream_id!r}: the frame had no "
            "events, or its snapshot is no longer kept or was skipped",
        )
    return Response(
        content=snapshot.jpeg,
        media_type="image/jpeg",
        # A snapshot never changes once taken: caches may keep it (the stream's own URL
        # space; a stream added again under the id starts its frame indices again).
        headers={"Cache-Control": "private, max-age=60", "X-Vdet-Frame-Index": str(frame_index)},
    )


__all__ = ["router"]
