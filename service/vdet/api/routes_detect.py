"""POST /v1/detect: detections for one uploaded image.

The body is either raw image bytes or multipart/form-data with a `file` (or `image`) part. The
size limit is enforced twice: a declared Content-Length over it is refused before anything is
read, and the bytes actually received are counted while streaming, so a client that lies or
uses chunked encoding is cut off at the limit, never buffered beyond it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncGenerator
from typing import Annotated

import numpy as np
from fastapi import APIRouter, HTTPException, Query, Request, status
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser

from vdet.api.deps import ServiceDep, StreamsDep
from vdet.api.images import (
    SUPPORTED_FORMATS,
    DecodeBudget,
    UnsupportedImageError,
    decode_image,
    probe_image,
)
from vdet.api.schemas import DetectOut, ErrorOut
from vdet.results.wire import detections_out, timings_out
from vdet.streams.params import resolve_params

router = APIRouter(tags=["detect"])

# How long an upload waits for its share of limits.decode_budget_pixels before a 503.
DECODE_WAIT_S = 10.0

_IMAGE_MEDIA_TYPES = [f"image/{fmt}" for fmt in SUPPORTED_FORMATS]
_BINARY = {"schema": {"type": "string", "format": "binary"}}
_REQUEST_BODY = {
    "required": True,
    "description": "The image: raw bytes, or multipart/form-data with a `file` part. "
    "JPEG, PNG, BMP or WebP, recognised by content (not by the declared type).",
    "content": {
        "multipart/form-data": {
            "schema": {
                "type": "object",
                "properties": {"file": {"type": "string", "format": "binary"}},
                "required": ["file"],
            }
        },
        **{media: _BINARY for media in _IMAGE_MEDIA_TYPES},
        "application/octet-stream": _BINARY,
    },
}


def _too_large(limit: int) -> HTTPException:
    return HTTPException(
        status.HTTP_413_CONTENT_TOO_LARGE,
        detail=f"request body exceeds max_upload_bytes ({limit} bytes)",
    )


async def _limited_stream(request: Request, limit: int) -> AsyncGenerator[bytes, None]:
    received = 0
    async for chunk in request.stream():
        received += len(chunk)
        if received > limit:
            raise _too_large(limit)
        yield chunk


async def _read_upload(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            too_large = int(declared) > limit
        except ValueError:
            raise HTTPException(
                status.HTTP_400_BAD_REQUEST, detail="invalid Content-Length header"
            ) from None
        if too_large:
            raise _too_large(limit)
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type == "multipart/form-data":
        return await _read_multipart(request, limit)
    if media_type and not (
        media_type.startswith("image/") or media_type == "application/octet-stream"
    ):
        raise HTTPException(
            status.HTTP_415_UNSUPPORTED_MEDIA_TYPE,
            detail=f"unsupported content type {media_type!r}; send image bytes "
            f"({', '.join(SUPPORTED_FORMATS)}) or multipart/form-data with a 'file' part",
        )
    body = bytearray()
    async for chunk in _limited_stream(request, limit):
        body += chunk
    return bytes(body)


async def _read_multipart(request: Request, limit: int) -> bytes:
    parser = MultiPartParser(
        request.headers,
        _limited_stream(request, limit),
        max_files=1,
        max_fields=16,
        max_part_size=64 * 1024,
    )
    try:
        form = await parser.parse()
    except MultiPartException as exc:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT, detail=f"malformed multipart body: {exc}"
        ) from exc
    try:
        part = form.get("file") or form.get("image")
        if not isinstance(part, UploadFile):
            raise HTTPException(
                status.HTTP_422_UNPROCESSABLE_CONTENT,
                detail="multipart body needs a file part named 'file'",
            )
        return await part.read()
    finally:
        await form.close()


@router.post(
    "/v1/detect",
    response_model=DetectOut,
    summary="Detect objects in one uploaded image",
    openapi_extra={"requestBody": _REQUEST_BODY},
    responses={
        400: {"model": ErrorOut, "description": "Invalid Content-Length header."},
        413: {"model": ErrorOut, "description": "Body larger than max_upload_bytes."},
        415: {
            "model": ErrorOut,
            "description": "Not a JPEG/PNG/BMP/WebP image, corrupt, or too many pixels.",
        },
        422: {
            "model": ErrorOut,
            "description": "Invalid query parameters, unknown classes, or malformed multipart.",
        },
    },
)
async def detect(
    request: Request,
    service: ServiceDep,
    streams: StreamsDep,
    conf: Annotated[
        float | None,
        Query(ge=0.0, le=1.0, description="Minimum score (default: the server's setting)."),
    ] = None,
    iou: Annotated[float | None, Query(ge=0.0, le=1.0, description="NMS IoU threshold.")] = None,
    max_det: Annotated[
        int | None, Query(ge=1, le=10_000, description="Most detections returned.")
    ] = None,
    classes: Annotated[
        list[str] | None,
        Query(description="Only these classes: names or ids, repeated or comma-separated."),
    ] = None,
) -> DetectOut:
    wanted = None
    if classes is not None:
        wanted = [c.strip() for item in classes for c in item.split(",") if c.strip()]
    try:
        params = resolve_params(
            service.settings.detection,
            service.class_names,
            conf_threshold=conf,
            iou_threshold=iou,
            max_det=max_det,
            classes=wanted or None,
        )
    except ValueError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=str(exc)) from exc

    data = await _read_upload(request, service.settings.max_upload_bytes)
    limits = service.settings.limits
    fit = max(streams.backend_info.input_hw)
    started = time.perf_counter()
    try:
        header = await run_in_threadpool(probe_image, data, limits.max_image_pixels, fit)
        budget: DecodeBudget = request.app.state.decode_budget
        async with budget.share(header.cost_pixels, DECODE_WAIT_S):
            decoded = await run_in_threadpool(decode_image, data, limits.max_image_pixels, fit)
    except UnsupportedImageError as exc:
        raise HTTPException(status.HTTP_415_UNSUPPORTED_MEDIA_TYPE, detail=str(exc)) from exc
    except TimeoutError:
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            detail=f"images being decoded hold limits.decode_budget_pixels ({budget.pixels}); "
            "retry shortly",
            headers={"Retry-After": str(limits.retry_after_s)},
        ) from None
    del data  # the encoded bytes are not needed any more
    decode_done = time.perf_counter()
    dets, timings = await run_in_threadpool(streams.detect, decoded.image, params)
    sx, sy = decoded.scale_xy
    if (sx, sy) != (1.0, 1.0):  # boxes in the upload's own pixels
        scale = np.array([sx, sy, sx, sy], dtype=dets.xyxy.dtype)
        dets = dataclasses.replace(dets, xyxy=dets.xyxy * scale)
    timings_ms = timings_out(timings)
    timings_ms.decode = (decode_done - started) * 1e3
    timings_ms.end_to_end = (time.perf_counter() - started) * 1e3
    return DetectOut(
        image_width=decoded.width,
        image_height=decoded.height,
        detections=detections_out(dets, service.class_names),
        timings_ms=timings_ms,
    )
