"""REST routes for streams: add, list, inspect, change, delete, latest detections, snapshot.

Handlers are plain `def`: FastAPI runs them in its thread pool, so the manager's locks, thread
joins and JPEG encoding never run on the event loop. The one exception is the latest
detections, a dictionary lookup that serves a worker's wire text as it is: on a loop busy with
thousands of WebSocket messages a second, each hop to the thread pool and back waited for the
GIL (p99 20-30 ms at 64 streams).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Response, status

from vdet.api.deps import ControlDep, ServiceDep, StreamsDep
from vdet.api.schemas import EffectiveParams, ErrorOut, StreamListOut, StreamOut, StreamStatusOut
from vdet.config.streams import StreamSpec
from vdet.core.redact import redact
from vdet.ingest.urls import NETWORK_SCHEMES, is_network_url
from vdet.results.hub import EncodedResult
from vdet.results.wire import DetectionResultOut, result_out, result_text
from vdet.streams.service import PictureRequest, StreamChanges, StreamView, UnknownStreamError

router = APIRouter(prefix="/v1/streams", tags=["streams"])

_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorOut, "description": "No stream has this id."}
}


def stream_out(view: StreamView, names: tuple[str, ...]) -> StreamOut:
    p, s = view.params, view.status
    return StreamOut(
        id=view.spec.id,
        worker=view.worker,
        spec=view.spec.model_copy(update={"url": redact(view.spec.url)}),
        effective=EffectiveParams(
            conf_threshold=p.conf_threshold,
            iou_threshold=p.iou_threshold,
            max_det=p.max_det,
            top_k=p.top_k,
            classes=None if p.classes is None else [names[i] for i in sorted(p.classes)],
            class_thresholds=class_thresholds_out(view.spec.class_thresholds, names),
        ),
        status=StreamStatusOut(
            state=s.state,
            attempts=s.attempts,
            reconnects=s.reconnects,
            # Redacted here too, whichever process produced them (vdet.ingest.urls.redact).
            last_error=_redacted(s.last_error),
            last_error_time=s.last_error_time,
            recent_errors=[redact(error) for error in s.recent_errors],
            pipeline_error=_redacted(view.pipeline_error),
            last_frame_age_s=view.last_frame_age_s,
            fps=s.fps,
            fps_nominal=s.fps_nominal,
            fps_processed=view.fps_processed,
            width=s.width,
            height=s.height,
            frames_decoded=s.frames_decoded,
            frames_processed=view.frames_processed,
            frames_dropped=s.frames_dropped,
            decode_errors=s.decode_errors,
            frames_damaged=s.frames_damaged,
            decode_path="nvdec" if s.decode_path == "nvdec" else "cpu" if s.decode_path else None,
            decode_reason=_redacted(s.decode_reason),
            frames_skipped=s.frames_skipped,
        ),
    )


def class_thresholds_out(
    thresholds: dict[str, float] | None, names: tuple[str, ...]
) -> dict[str, float] | None:
    """The spec's per-class thresholds keyed by class name (an id given as "2" shows as its
    name)."""
    if not thresholds:
        return None

    def name(ref: str) -> str:
        if ref in names or not ref.isdigit() or int(ref) >= len(names):
            return ref
        return names[int(ref)]

    return {name(ref): threshold for ref, threshold in thresholds.items()}


def _redacted(text: str | None) -> str | None:
    return None if text is None else redact(text)


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
def list_streams(streams: StreamsDep) -> StreamListOut:
    names = streams.backend_info.class_names
    return StreamListOut(streams=[stream_out(v, names) for v in streams.list()])


@router.get(
    "/{stream_id}",
    response_model=StreamOut,
    summary="A stream's spec, effective thresholds and source status",
    responses=_NOT_FOUND,
)
def get_stream(stream_id: str, streams: StreamsDep) -> StreamOut:
    return stream_out(streams.get(stream_id), streams.backend_info.class_names)


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
    if stream_id not in streams:  # both stream services answer from memory, without waiting
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
def snapshot(stream_id: str, streams: StreamsDep) -> Response:
    frame = streams.picture(stream_id, PictureRequest())
    if frame is None:
        return Response(status_code=status.HTTP_204_NO_CONTENT)
    return Response(
        content=frame.jpeg,
        media_type="image/jpeg",
        headers={"Cache-Control": "no-store", "X-Vdet-Seq": str(frame.seq)},
    )
