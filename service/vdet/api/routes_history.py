"""GET /v1/events/history: the zone and line events of every stream, newest first, filtered
and paged (vdet.results.history keeps them: the newest `hub.event_history`). Each event names
its frame's event snapshot, kept while it is among the stream's newest
`event_snapshots.per_stream`."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Query, Request, status
from pydantic import BaseModel, Field

from vdet.config.streams import STREAM_ID_PATTERN
from vdet.results.history import EventHistory, EventQuery, EventRecord
from vdet.streams.event_snapshots import snapshot_path

router = APIRouter(prefix="/v1/events", tags=["streams"])

MAX_PAGE = 500
_Names = Annotated[list[Annotated[str, Field(max_length=256)]] | None, Query(max_length=64)]


class HistoryEventOut(BaseModel):
    id: int = Field(description="Numbers the events kept; pass the last one's as `before_id`.")
    seq: int = Field(description="The result that carried the event (as on the WebSocket).")
    source_id: str
    frame_index: int
    time: float = Field(description="Unix time the frame's last packet was read.")
    type: Literal["zone_enter", "zone_exit", "line_cross"]
    zone: str = Field(description="The zone's (or line's) id.")
    class_id: int
    class_name: str
    track_id: int
    direction: Literal["in", "out"] | None = None
    dwell_s: float | None = None
    snapshot: str = Field(description="The frame's event snapshot (404 once it is no longer kept).")


class HistoryOut(BaseModel):
    events: list[HistoryEventOut] = Field(description="Newest first, at most `limit`.")
    next_before_id: int | None = Field(
        description="More (older) events match: ask again with this as `before_id`; null: none."
    )
    kept: int = Field(description="Events held now, all streams (the newest hub.event_history).")


def _out(event: EventRecord) -> HistoryEventOut:
    return HistoryEventOut(
        id=event.id,
        seq=event.seq,
        source_id=event.source_id,
        frame_index=event.frame_index,
        time=event.time,
        type=event.type,  # type: ignore[arg-type]
        zone=event.zone,
        class_id=event.class_id,
        class_name=event.class_name,
        track_id=event.track_id,
        direction=event.direction,  # type: ignore[arg-type]
        dwell_s=event.dwell_s,
        snapshot=snapshot_path(event.source_id, event.frame_index),
    )


@router.get(
    "/history",
    response_model=HistoryOut,
    summary="Zone and line events of every stream, newest first, filtered and paged",
)
def event_history(
    request: Request,
    stream: Annotated[
        list[Annotated[str, Field(pattern=STREAM_ID_PATTERN)]] | None,
        Query(max_length=64, description="Only these streams (repeat the parameter)."),
    ] = None,
    zone: Annotated[_Names, Query(description="Only these zones or lines.")] = None,
    type: Annotated[
        list[Literal["zone_enter", "zone_exit", "line_cross"]] | None,
        Query(max_length=3, description="Only these event types."),
    ] = None,
    class_name: Annotated[_Names, Query(description="Only these classes.")] = None,
    since: Annotated[
        float | None, Query(allow_inf_nan=False, description="Unix time, inclusive.")
    ] = None,
    until: Annotated[
        float | None, Query(allow_inf_nan=False, description="Unix time, exclusive.")
    ] = None,
    before_id: Annotated[
        int | None, Query(ge=1, description="The next page: the `next_before_id` of the last.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
) -> HistoryOut:
    history: EventHistory | None = getattr(request.app.state, "event_history", None)
    if history is None:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, detail="starting")
    page = history.query(
        EventQuery(
            streams=set(stream) if stream else None,
            zones=set(zone) if zone else None,
            types=set(type) if type else None,
            classes=set(class_name) if class_name else None,
            since=since,
            until=until,
            before_id=before_id,
            limit=limit,
        )
    )
    return HistoryOut(
        events=[_out(e) for e in page.events],
        next_before_id=page.events[-1].id if page.more and page.events else None,
        kept=page.kept,
    )
