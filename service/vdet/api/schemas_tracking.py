"""The JSON shapes of tracking: zone events on results, and the zones API's bodies.

Zones themselves are `ZoneSpec`s (vdet.config.tracking), the same model as in config; this
module adds the envelopes around them and the event wire format. Nothing here touches
streams or the tracker.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from vdet.config.base import Strict
from vdet.config.tracking import ZoneList, ZoneSpec


class ZonesOut(BaseModel):
    zones: list[ZoneSpec] = Field(description="The stream's zones and lines, in order.")


class ZonesIn(Strict):
    """All of a stream's zones at once (PUT /v1/streams/{id}/zones)."""

    zones: ZoneList


class CountsOut(BaseModel):
    """A stream's zone and line counts (as `vdet_zone_objects` and `vdet_line_crossings_total`
    say them)."""

    objects: dict[str, dict[str, int]] = Field(
        description="Per polygon zone: the tracks inside it now, by class name."
    )
    crossings: dict[str, dict[str, dict[str, int]]] = Field(
        description="Per counting line: crossings since the stream started, by direction "
        "('in', 'out') and class name."
    )
