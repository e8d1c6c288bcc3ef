"""REST routes for streams: add, list, inspect, change, delete, latest detections, snapshot.

The stream service's calls (the manager's locks, thread joins, JPEG encoding) never run on the
event loop: the writes are plain `def` handlers, which FastAPI runs in its thread pool, and the
reads send them there themselves, because in a fleet a read may instead ask another node
(vdet.api.fleet_reads), which happens on the loop. The latest detections stay a dictionary
lookup on the loop that serves a worker's wire text as it is: on a loop busy with thousands of
WebSocket messages a second, each hop to the thread pool and back waited for the GIL (p99
20-30 ms at 64 streams).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Response, status
from starlette.concurrency import run_in_threadpool

from vdet.api import fleet_reads
from vdet.api.deps import ControlDep, ServiceDep, StreamsDep, get_streams_of
from vdet.api.schemas import ErrorOut, StreamListOut, StreamOut
from vdet.api.views import stream_out
from vdet.config.streams import StreamSpec
from vdet.ingest.urls import NETWORK_SCHEMES, is_network_url
from vdet.results.hub import EncodedResult
from vdet.results.wire import DetectionResultOut, result_out, result_text
from vdet.streams.service import PictureRequest, StreamChanges, UnknownStreamError

router = APIRouter(prefix="/v1/streams", tags=["streams"])

_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorOut, "description": "No stream has this id."}
}


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=StreamOut,
    summary="Add a stream and start detecting on it",
    responses={
        409: {
            "model": ErrorOut,
            "description": "A stream with this id exists, or max_streams streams are running "
            "(delete one first; retrying will not help until then).",
        },
        422: {
            "model": ErrorOut,
            "description": "Invalid body, unsupported URL scheme (the message names the "
            "allowed ones), a scheme or host the server's source policy refuses, a local "
            "file that is not allowed or cannot be opened (one message for both), or "
            "unknown class names.",
        },
    },
)
def add_stream(
    spec: StreamSpec, response: Response, control: ControlDep, service: ServiceDep
) -> StreamOut:
    if not service.settings.allow_file_sources and not is_network_url(spec.url):
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT,
            detail="local file sources are disabled on this server (allow_file_sources=false); "
            f"use one of {', '.join(f'{s}://' for s in NETWORK_SCHEMES)}",
        )
    try:
        view = control.add(spec)
    except ValueError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=str(exc)) from exc
    response.headers["Location"] = f"/v1/streams/{spec.id}"
    return stream_out(view, service.class_names)


@router.get("", response_model=StreamListOut, summary="List streams, sorted by id")
async def list_streams(service: ServiceDep) -> StreamListOut:
    if service.fleet is not None:  # every node's streams (vdet.api.fleet_reads)
        return StreamListOut(streams=await fleet_reads.list_streams(service))
    streams = get_streams_of(service)
    names = streams.backend_info.class_names
    views = await run_in_threadpool(streams.list)
    return StreamListOut(streams=[stream_out(v, names) for v in views])


@router.get(
    "/{stream_id}",
    response_model=StreamOut,
    summary="A stream's spec, effective thresholds and source status",
    responses=_NOT_FOUND,
)
async def get_stream(stream_id: str, service: ServiceDep) -> StreamOut:
    if service.fleet is not None:
        return await fleet_reads.get_stream(service, stream_id)
    streams = get_streams_of(service)
    view = await run_in_threadpool(streams.get, stream_id)
    return stream_out(view, streams.backend_info.class_names)


@router.patch(
    "/{stream_id}",
    response_model=StreamOut,
    summary="Change a stream's thresholds or class filter (from its next frame)",
    responses={
        **_NOT_FOUND,
        422: {"model": ErrorOut, "description": "Invalid body or unknown class names."},
    },
)
def patch_stream(
    stream_id: str, changes: StreamChanges, control: ControlDep, service: ServiceDep
) -> StreamOut:
    try:
        view = control.change(stream_id, changes)
    except ValueError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=str(exc)) from exc
    return stream_out(view, service.class_names)


@router.delete(
    "/{stream_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    summary="Stop and remove a stream, its latest result and its metrics",
    responses=_NOT_FOUND,
)
def delete_stream(stream_id: str, control: ControlDep) -> Response:
    control.remove(stream_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get(
    "/{stream_id}/detections",
    response_model=DetectionResultOut,
    summary="The latest detections of a stream",
    responses={
        **_NOT_FOUND,
        204: {"description": "The stream has not produced a result yet (no body)."},
    },
)
async def latest_detections(
    stream_id: str, streams: StreamsDep, service: ServiceDep
) -> DetectionResultOut | Response:
    # Both stream services answer from memory, without waiting; in a fleet the hub has every
    # node's results, so any of the fleet's streams is answered here.
    if not service.has_stream(stream_id):
        raise UnknownStreamError(f"no stream {stream_id!r}")
    latest = service.hub.latest_encoded(stream_id)
    if latest is None:
        return Response(status_code=status.HTTP_204_NO_CONTENT)
    if isinstance(latest, EncodedResult):
        return Response(result_text(latest), media_type="application/json")
    return result_out(latest, streams.backend_info.class_names)


@router.get(
    "/{stream_id}/snapshot.jpg",
    response_class=Response,
    summary="The last processed frame with its detections drawn, as JPEG",
    responses={
        200: {
            "content": {"image/jpeg": {"schema": {"type": "string", "format": "binary"}}},
            "description": "JPEG; header X-Vdet-Seq gives the result's seq.",
        },
        204: {"description": "No frame has been processed yet (no body)."},
        **_NOT_FOUND,
    },
)
async def snapshot(stream_id: str, service: ServiceDep) -> Response:
    if service.fleet is not None:  # from the node that runs it
        frame = await fleet_reads.picture(service, stream_id, PictureRequest())
    else:
        streams = get_streams_of(service)
        frame = await run_in_threadpool(streams.picture, stream_id, PictureRequest())
    if frame is None:
        return Response(status_code=status.HTTP_204_NO_CONTENT)
    return Response(
        content=frame.jpeg,
        media_type="image/jpeg",
        headers={"Cache-Control": "no-store", "X-Vdet-Seq": str(frame.seq)},
    )
