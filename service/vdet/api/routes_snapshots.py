"""Event snapshots over REST: GET /v1/streams/{id}/snapshots lists the JPEGs kept of a stream's
frames with zone and line events (vdet.streams.event_snapshots), GET
/v1/streams/{id}/snapshots/{frame_index}.jpg answers one. The webhook and MQTT bodies name the
second by `snapshot_path` (vdet.streams.event_snapshots). In a fleet, a stream another node runs
is asked of that node (vdet.api.fleet_reads)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Path, Response, status
from starlette.concurrency import run_in_threadpool

from vdet.api import fleet_reads
from vdet.api.deps import ServiceDep, get_streams_of
from vdet.api.schemas import ErrorOut
from vdet.api.schemas_snapshots import EventSnapshotsOut, event_snapshots_out

router = APIRouter(prefix="/v1/streams", tags=["streams"])


_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorOut, "description": "No such stream, or no snapshot of that frame."}
}


@router.get(
    "/{stream_id}/snapshots",
    response_model=EventSnapshotsOut,
    summary="The JPEGs kept of the stream's frames with zone and line events",
    responses=_NOT_FOUND,
)
async def list_snapshots(stream_id: str, service: ServiceDep) -> EventSnapshotsOut:
    streams = get_streams_of(service)
    if service.fleet is not None and stream_id not in streams:
        return await fleet_reads.event_snapshots(service, stream_id)
    found = await run_in_threadpool(streams.event_snapshots, stream_id)
    return event_snapshots_out(stream_id, found, streams.backend_info.class_names)


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
async def get_snapshot(
    stream_id: str, service: ServiceDep, frame_index: int = Path(ge=0, le=2**53)
) -> Response:
    streams = get_streams_of(service)
    if service.fleet is not None and stream_id not in streams:
        jpeg = await fleet_reads.event_snapshot(service, stream_id, frame_index)
    else:
        snapshot = await run_in_threadpool(streams.event_snapshot, stream_id, frame_index)
        jpeg = None if snapshot is None else snapshot.jpeg
    if jpeg is None:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            f"no snapshot of frame {frame_index} of stream {stream_id!r}: the frame had no "
            "events, or its snapshot is no longer kept or was skipped",
        )
    return Response(
        content=jpeg,
        media_type="image/jpeg",
        # A snapshot never changes once taken: caches may keep it (the stream's own URL
        # space; a stream added again under the id starts its frame indices again).
        headers={"Cache-Control": "private, max-age=60", "X-Vdet-Frame-Index": str(frame_index)},
    )


__all__ = ["router"]
