"""GET /v1/streams/{id}/live.mjpeg: a stream's frames as multipart MJPEG at a bounded rate.

Each part is the stream's latest frame at the time of a tick (at most `fps` ticks a second,
only frames not sent yet): the newest decoded one with the newest result, or on request the
last processed one with its own result; optionally with the result's boxes drawn. Admission,
shared encodes and framing live in `vdet.api.live`; this module paces one viewer and speaks HTTP.
In a fleet, a stream another node runs is watched through its owner (each picture asked of it,
vdet.api.fleet_reads.OwnerPictures), under this node's viewer cap and rate.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query, Request, status
from fastapi.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from vdet.api import fleet_reads
from vdet.api.deps import ServiceDep, StreamsDep
from vdet.api.live import (
    MEDIA_TYPE,
    LiveVideo,
    PictureKey,
    Pictures,
    ViewerLimitError,
    multipart_part,
)
from vdet.api.schemas import ErrorOut
from vdet.root import Service
from vdet.streams.service import Picture, UnknownStreamError

router = APIRouter(prefix="/v1/streams", tags=["streams"])
log = logging.getLogger(__name__)


def live_video_of(request: Request) -> LiveVideo:
    live: LiveVideo = request.app.state.live_video
    return live


class _ViewerStalledError(Exception):
    """A part did not go out within the send timeout: the viewer stopped reading."""


class _ViewerResponse(StreamingResponse):
    """Frees the viewer's slot however the response ends (even before its first byte), and
    ends the response of a viewer that stopped reading (`live.send_timeout_s`)."""

    def __init__(
        self, content: AsyncIterator[bytes], release: Any, send_timeout_s: float, **kwargs: Any
    ) -> None:
        super().__init__(content, **kwargs)
        self._release = release
        self._send_timeout_s = send_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def timed_send(message: Message) -> None:
            try:
                async with asyncio.timeout(self._send_timeout_s):
                    await send(message)
            except TimeoutError:
                raise _ViewerStalledError from None

        try:
            await super().__call__(scope, receive, timed_send)
        except _ViewerStalledError:
            # Returning with the body unfinished makes the server close the connection.
            log.warning(
                "live viewer %s of %s dropped: a frame did not go out in %g s "
                "(live.send_timeout_s)",
                _client(scope),
                scope.get("path", "?"),
                self._send_timeout_s,
            )
        finally:
            self._release()


def _client(scope: Scope) -> str:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else "?"


@router.get(
    "/{stream_id}/live.mjpeg",
    response_class=StreamingResponse,
    summary="Live video of a stream as multipart MJPEG (bounded rate, boxes optional)",
    responses={
        200: {
            "content": {MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}},
            "description": "An endless multipart/x-mixed-replace body of JPEG parts; each "
            "part's `X-Vdet-Seq` header is the seq (on the WebSocket feed) of the result that "
            "goes with the frame, `X-Vdet-Frame` the frame's index in its stream, "
            "`X-Vdet-Result-Frame` the index of the frame that result was detected on, and "
            "`X-Vdet-Source-Size` the decoded frame's WxH (the space of the boxes). "
            "Frames are encoded only while someone watches.",
        },
        404: {"model": ErrorOut, "description": "No stream has this id."},
        422: {"model": ErrorOut, "description": "A parameter out of its range."},
        503: {
            "model": ErrorOut,
            "description": "live.max_viewers viewers are already watching (or not ready).",
        },
    },
)
async def live_mjpeg(
    stream_id: str,
    request: Request,
    service: ServiceDep,
    streams: StreamsDep,
    fps: Annotated[
        float,
        Query(gt=0, le=60, description="Most frames per second to send (<= live.max_fps)."),
    ] = 10.0,
    boxes: Annotated[
        bool, Query(description="Draw boxes, class and score on the frames (server side).")
    ] = True,
    max_width: Annotated[
        int | None,
        Query(
            ge=160,
            le=7680,
            description="Scale frames down to this width (capped at live.max_width).",
        ),
    ] = None,
    frames: Annotated[
        Literal["newest", "processed"],
        Query(
            description="`newest`: the newest decoded frame with the newest result (the "
            "video runs at `fps` even when detection is slower; boxes trail the picture by "
            "the detection latency); `processed`: only frames detection finished, each with "
            "its own result (boxes exact, rate at most the detection rate). Streams decoded "
            "on a GPU always send processed frames."
        ),
    ] = "newest",
) -> StreamingResponse:
    live = live_video_of(request)
    source: Pictures = streams
    if stream_id not in streams:
        if service.fleet is None or not service.has_stream(stream_id):
            raise UnknownStreamError(f"no stream {stream_id!r}")
        source = fleet_reads.OwnerPictures(service, asyncio.get_running_loop())
    width = min(max_width or live.settings.max_width, live.settings.max_width)
    key = PictureKey(stream_id=stream_id, boxes=boxes, max_width=width, newest=frames == "newest")
    try:
        slot = live.admit(key)
    except ViewerLimitError as exc:
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE, detail=str(exc), headers={"Retry-After": "5"}
        ) from exc
    return _ViewerResponse(
        _frames(service, live, source, key, min(fps, live.settings.max_fps)),
        slot.release,
        live.settings.send_timeout_s,
        media_type=MEDIA_TYPE,
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


async def _frames(
    service: Service,
    live: LiveVideo,
    streams: Pictures,
    key: PictureKey,
    fps: float,
) -> AsyncIterator[bytes]:
    loop = asyncio.get_running_loop()
    period = 1.0 / fps
    last: Picture | None = None
    # Ends when the stream is removed or the service stops; when the client leaves, the
    # response cancels this generator (StreamingResponse listens for the disconnect).
    while service.ready:
        tick = loop.time()
        try:
            frame = await live.next_frame(streams, key, last)
        except UnknownStreamError:
            return
        if frame is not None:
            yield multipart_part(frame)
            service.metrics.live_frames_sent.inc()
            last = frame.picture
        await asyncio.sleep(max(0.0, period - (loop.time() - tick)))
