"""REST routes for a stream's zones and counting lines: list, replace, get, put, delete.

The zones are part of the stream's spec (`StreamSpec.zones`), so PATCH /v1/streams/{id} and
config files set the same thing; these routes change one zone without resending the others,
through the same `StreamControl.change`, which validates them against the model and the
stream (classes, frame size). Edits here are serialised by one lock, so two concurrent edits
of a stream's zones both land. Changes apply from the stream's next frame. Handlers are plain
`def` (the thread pool): the streams' locks never run on the event loop.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from fastapi import APIRouter, HTTPException, Response, status
from pydantic import ValidationError

from vdet.api import fleet_reads
from vdet.api.deps import ControlDep, ServiceDep, SpecsDep, get_streams_of
from vdet.api.schemas import ErrorOut
from vdet.api.schemas_tracking import CountsOut, ZonesIn, ZonesOut
from vdet.config.tracking import ZoneBody, ZoneSpec
from vdet.streams.service import StreamChanges, UnknownStreamError

router = APIRouter(prefix="/v1/streams/{stream_id}/zones", tags=["streams"])

_EDITS = threading.Lock()  # one read-modify-write of a zone list at a time
_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorOut, "description": "No stream has this id, or it has no such zone."}
}
_INVALID: dict[int | str, dict[str, Any]] = {
    422: {
        "model": ErrorOut,
        "description": "Invalid zone: a polygon that crosses itself or has no area, a line "
        "without exactly 2 distinct points, coordinates outside 0..1 (normalised) or outside "
        "the stream's frame (pixels), unknown classes, too many points or zones, a duplicate "
        "id, unknown keys.",
    }
}
ZoneChange = Callable[[list[ZoneSpec]], list[ZoneSpec]]


def _unprocessable(exc: Exception) -> HTTPException:
    if isinstance(exc, ValidationError):
        detail = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'zones'}: {err['msg']}"
            for err in exc.errors()
        )
    else:
        detail = str(exc)
    return HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=detail)


def _edit(
    spec_of: SpecsDep, control: ControlDep, stream_id: str, change: ZoneChange
) -> list[ZoneSpec]:
    """The stream's zones after `change`; 422 for what the streams refuse, 404 as usual. (In
    a fleet two nodes may edit one stream's zones at once: the later write wins whole.)"""
    with _EDITS:
        zones = change(list(spec_of(stream_id).zones))
        try:
            view = control.change(stream_id, StreamChanges(zones=zones))
        except ValueError as exc:  # pydantic's ValidationError is one
            raise _unprocessable(exc) from exc
    return list(view.spec.zones)


def _zones_out(zones: Sequence[ZoneSpec]) -> ZonesOut:
    return ZonesOut(zones=list(zones))


def _no_zone(stream_id: str, zone_id: str) -> HTTPException:
    return HTTPException(
        status.HTTP_404_NOT_FOUND, detail=f"stream {stream_id!r} has no zone {zone_id!r}"
    )


@router.get("", response_model=ZonesOut, summary="A stream's zones and lines", responses=_NOT_FOUND)
def list_zones(stream_id: str, spec_of: SpecsDep) -> ZonesOut:
    return _zones_out(spec_of(stream_id).zones)


@router.put(
    "",
    response_model=ZonesOut,
    summary="Replace all of a stream's zones and lines",
    responses={**_NOT_FOUND, **_INVALID},
)
def replace_zones(
    stream_id: str, body: ZonesIn, spec_of: SpecsDep, control: ControlDep
) -> ZonesOut:
    return _zones_out(_edit(spec_of, control, stream_id, lambda _: list(body.zones)))


@router.delete(
    "",
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    summary="Remove all of a stream's zones and lines",
    responses=_NOT_FOUND,
)
def delete_zones(stream_id: str, spec_of: SpecsDep, control: ControlDep) -> Response:
    _edit(spec_of, control, stream_id, lambda _: [])
    return Response(status_code=status.HTTP_204_NO_CONTENT)


counts_router = APIRouter(prefix="/v1/streams/{stream_id}", tags=["streams"])


@counts_router.get(
    "/counts",
    response_model=CountsOut,
    summary="A stream's zone occupancy and line crossings, by class",
    responses=_NOT_FOUND,
)
async def zone_counts(stream_id: str, service: ServiceDep) -> CountsOut:
    # Async: in a fleet the counts of a stream on another node are asked of that node.
    if service.fleet is not None:
        return await fleet_reads.counts(service, stream_id)
    if stream_id not in get_streams_of(service):  # from memory, without waiting
        raise UnknownStreamError(f"no stream {stream_id!r}")
    counts = service.metrics.zone_counts(stream_id)
    return CountsOut(objects=counts.objects, crossings=counts.crossings)


@router.get("/{zone_id}", response_model=ZoneSpec, summary="One zone or line", responses=_NOT_FOUND)
def get_zone(stream_id: str, zone_id: str, spec_of: SpecsDep) -> ZoneSpec:
    for zone in spec_of(stream_id).zones:
        if zone.id == zone_id:
            return zone
    raise _no_zone(stream_id, zone_id)


@router.put(
    "/{zone_id}",
    response_model=ZoneSpec,
    summary="Add or replace one zone or line (201 when added)",
    responses={201: {"model": ZoneSpec, "description": "Added."}, **_NOT_FOUND, **_INVALID},
)
def put_zone(
    stream_id: str,
    zone_id: str,
    body: ZoneBody,
    response: Response,
    spec_of: SpecsDep,
    control: ControlDep,
) -> ZoneSpec:
    try:
        zone = ZoneSpec.model_validate({**body.model_dump(), "id": zone_id})
    except ValidationError as exc:  # the id in the path
        raise _unprocessable(exc) from exc
    added = False

    def change(zones: list[ZoneSpec]) -> list[ZoneSpec]:
        nonlocal added
        added = all(z.id != zone_id for z in zones)
        return [*zones, zone] if added else [zone if z.id == zone_id else z for z in zones]

    _edit(spec_of, control, stream_id, change)
    if added:
        response.status_code = status.HTTP_201_CREATED
        response.headers["Location"] = f"/v1/streams/{stream_id}/zones/{zone_id}"
    return zone


@router.delete(
    "/{zone_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    summary="Remove one zone or line",
    responses=_NOT_FOUND,
)
def delete_zone(stream_id: str, zone_id: str, spec_of: SpecsDep, control: ControlDep) -> Response:
    def change(zones: list[ZoneSpec]) -> list[ZoneSpec]:
        if all(z.id != zone_id for z in zones):
            raise _no_zone(stream_id, zone_id)
        return [z for z in zones if z.id != zone_id]

    _edit(spec_of, control, stream_id, change)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
