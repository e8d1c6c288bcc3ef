"""Event clips over REST: list a stream's clips with their events and times, download one (HTTP
range requests answered, so that a browser can seek), delete one. The clips are read from the
clips folder (vdet.clips.store), whichever process of this node wrote them; a stream's clips
stay listed after the stream is removed, until the folder's limits delete them. In a fleet,
the clips of every node are listed, served and deleted through any node (vdet.api.fleet_clips)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Request, Response, status
from fastapi.responses import FileResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from vdet.api import fleet_clips
from vdet.api.deps import ServiceDep, StreamsDep
from vdet.api.fleet_clips import RemoteClip
from vdet.api.schemas import ErrorOut
from vdet.api.schemas_clips import ClipsOut, clips_out
from vdet.clips.store import CLIP_ID_PATTERN, MEDIA_TYPE, ClipStore
from vdet.config.streams import STREAM_ID_PATTERN

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/streams/{stream_id}/clips", tags=["streams"])

_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorOut, "description": "Clips are off (clips.folder), or no such clip."}
}
StreamId = Annotated[str, Path(pattern=STREAM_ID_PATTERN)]
ClipId = Annotated[str, Path(pattern=CLIP_ID_PATTERN, description="As listed.")]


def _clips_off() -> HTTPException:
    return HTTPException(status.HTTP_404_NOT_FOUND, detail="clips are off (clips.folder)")


def _store(service: Any) -> ClipStore:
    store = ClipStore.of(service.settings.clips)
    if store is None:
        raise _clips_off()
    return store


def _no_stream(stream_id: str) -> HTTPException:
    return HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no stream {stream_id!r}")


@router.get("", response_model=ClipsOut, summary="A stream's event clips", responses=_NOT_FOUND)
async def list_clips(stream_id: StreamId, service: ServiceDep, streams: StreamsDep) -> ClipsOut:
    fleet = service.fleet
    if fleet is not None:
        store = ClipStore.of(service.settings.clips)
        listing = await fleet_clips.list_clips(service, store, stream_id)
        if listing is None:
            raise _clips_off()
        if not listing.clips and fleet.spec(stream_id) is None:
            raise _no_stream(stream_id)
        return listing
    store = _store(service)
    listing = await run_in_threadpool(clips_out, store, stream_id, service.metrics, None)
    if not listing.clips and stream_id not in streams:
        raise _no_stream(stream_id)
    return listing


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
async def get_clip(
    stream_id: StreamId, clip_id: ClipId, service: ServiceDep, request: Request
) -> Response:
    store = ClipStore.of(service.settings.clips)
    found = None if store is None else await run_in_threadpool(store.get, stream_id, clip_id)
    if found is None and service.fleet is not None:
        remote = await fleet_clips.locate(service, stream_id, clip_id)
        if remote is not None:
            return _remote_clip(service, remote, request.headers.get("range"))
    if found is None:
        if store is None:
            raise _clips_off()
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no clip {clip_id!r}")
    _, path = found
    return FileResponse(
        path,
        media_type=MEDIA_TYPE.get(path.suffix, "video/mp4"),
        filename=f"{stream_id}-{path.name}",
        content_disposition_type="inline",
    )


@router.delete("/{clip_id}", status_code=204, summary="Delete one clip", responses=_NOT_FOUND)
async def delete_clip(stream_id: StreamId, clip_id: ClipId, service: ServiceDep) -> Response:
    store = ClipStore.of(service.settings.clips)
    deleted = store is not None and await run_in_threadpool(store.delete, stream_id, clip_id)
    if not deleted and service.fleet is not None:
        deleted = await fleet_clips.delete(service, stream_id, clip_id)
    elif store is None:
        raise _clips_off()
    if not deleted:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no clip {clip_id!r}")
    return Response(status_code=204)


def _remote_clip(service: Any, clip: RemoteClip, range_header: str | None) -> Response:
    """A clip another node keeps, streamed from it a part at a time: the whole video, or the
    one byte range asked for (206), as FileResponse answers a clip of this node."""
    size = clip.size
    try:
        start, end = byte_range(range_header, size)
    except ValueError:
        return Response(status_code=416, headers={"Content-Range": f"bytes */{size}"})
    part = fleet_clips.part_bytes(service)

    async def body() -> AsyncIterator[bytes]:
        offset = start
        while offset < end:
            try:
                data = await fleet_clips.read(service, clip, offset, min(part, end - offset))
            except fleet_clips.ClipPartError as exc:
                # The status is sent: the client sees the body end short of Content-Length.
                log.warning("clips: %s of node %s ended early: %s", clip.clip_id, clip.node, exc)
                return
            yield data
            offset += len(data)

    headers = {
        "Accept-Ranges": "bytes",
        "Content-Length": str(end - start),
        "Content-Disposition": f'inline; filename="{clip.stream_id}-{clip.name}"',
    }
    code = 200
    if (start, end) != (0, size):
        code = 206
        headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
    return StreamingResponse(body(), status_code=code, media_type=clip.media_type, headers=headers)


def byte_range(header: str | None, size: int) -> tuple[int, int]:
    """The bytes [start, end) a Range header asks of a `size`-byte file: all of it without
    one, for a range unit other than bytes and for several ranges (a server may answer those
    whole); ValueError when the one range asked for is not satisfiable (416)."""
    if header is None:
        return 0, size
    unit, _, ranges = header.strip().partition("=")
    if unit.strip().lower() != "bytes" or "," in ranges:
        return 0, size
    first, dash, last = ranges.strip().partition("-")
    if not dash:
        return 0, size
    try:
        if not first.strip():  # the last `last` bytes
            count = int(last)
            if count <= 0 or size == 0:
                raise ValueError("empty suffix range")
            return max(0, size - count), size
        start = int(first)
        end = size if not last.strip() else min(size, int(last) + 1)
    except ValueError:
        raise ValueError(f"not a byte range: {header[:80]!r}") from None
    if start < 0 or start >= size or end <= start:
        raise ValueError(f"range not satisfiable: {header[:80]!r}")
    return start, end
