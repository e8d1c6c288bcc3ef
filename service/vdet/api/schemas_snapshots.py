"""Event snapshots as the API shows them (GET /v1/streams/{id}/snapshots): the listing's
schema, and the listing made from a stream service's answer, on the node that runs the stream
(vdet.api.routes_snapshots; in a fleet, asked by another node through vdet.api.fleet_reads)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from vdet.results.wire import ZoneEventOut, events_out
from vdet.streams.event_snapshots import snapshot_path
from vdet.streams.service import EventSnapshotList


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


def event_snapshots_out(
    stream_id: str, found: EventSnapshotList, names: tuple[str, ...]
) -> EventSnapshotsOut:
    infos, counts = found
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


__all__ = ["EventSnapshotOut", "EventSnapshotsOut", "event_snapshots_out"]
