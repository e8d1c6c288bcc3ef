"""The JSON shapes of tracking: zone events on results, and the zones API's bodies.

Zones themselves are `ZoneSpec`s (vdet.tracking.specs), the same model as in config; this
module adds the envelopes around them and the event wire format. Nothing here touches
streams or the tracker.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from vdet.core.types import ZoneEvent
from vdet.tracking.specs import ZoneList, ZoneSpec


class ZoneEventOut(BaseModel):
    """A track entering or leaving a polygon zone, or crossing a line, on this result's frame."""

    type: Literal["zone_enter", "zone_exit", "line_cross"]
    zone: str = Field(description="The zone's (or line's) id.")
    track_id: int = Field(ge=1, description="The track, as in the detections' track_id.")
    class_id: int = Field(ge=0, description="The track's class on this frame.")
    class_name: str
    direction: Literal["in", "out"] | None = Field(
        default=None,
        description="line_cross only: 'in' when crossing from the left to the right of the "
        "line's first -> second point as seen on the image, else 'out'; null otherwise.",
    )
    dwell_s: float | None = Field(
        default=None,
        description="zone_exit only: seconds from the frame the track entered the zone to the "
        "last frame it was seen inside; null otherwise.",
    )


class ZonesOut(BaseModel):
    zones: list[ZoneSpec] = Field(description="The stream's zones and lines, in order.")


class ZonesIn(BaseModel):
    """All of a stream's zones at once (PUT /v1/streams/{id}/zones)."""

    model_config = ConfigDict(extra="forbid")

    zones: ZoneList


def events_out(events: Sequence[ZoneEvent], names: Sequence[str]) -> list[ZoneEventOut]:
    return [
        ZoneEventOut(
            type=e.type,
            zone=e.zone,
            track_id=e.track_id,
            class_id=e.class_id,
            class_name=names[e.class_id] if 0 <= e.class_id < len(names) else str(e.class_id),
            direction=e.direction,
            dwell_s=e.dwell_s,
        )
        for e in events
    ]
