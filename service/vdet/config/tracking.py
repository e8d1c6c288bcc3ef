"""The configuration of tracking and zones per stream: what `StreamSpec.tracking` and
`StreamSpec.zones` accept, in config files, POST /v1/streams, PATCH and the zones API.

Everything a client can send is checked here, once: bounds, point counts, polygons that cross
themselves, coordinates outside 0..1 (normalised) or beyond any frame (pixels). What needs the
model (class names) or the stream (its frame size) is checked where those are known
(vdet.tracking.zones). This module only describes and validates.
"""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
from pydantic import AfterValidator, Field, StrictBool, StrictFloat, StrictInt, model_validator

from vdet.config.base import ClassRef, Strict
from vdet.core.geometry import polygon_area, self_intersection

MAX_ZONES = 16  # per stream, polygons, lines and masks together
MAX_POLYGON_POINTS = 64
MAX_PIXEL_COORD = 16384.0  # beyond any frame a decoder here accepts (8K is 7680 wide)
ZONE_ID_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"


class TrackingSpec(Strict):
    """Per-stream tracker settings (ByteTrack association; see docs/tracking.md)."""

    enabled: StrictBool = Field(
        default=True,
        description="Track objects on this stream: track ids, zone and line events, counts.",
    )
    track_threshold: StrictFloat = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="Detections scoring at least this are matched first; weaker ones only "
        "continue tracks seen on the previous frame.",
    )
    new_track_threshold: StrictFloat = Field(
        default=0.6, ge=0.0, le=1.0, description="Least score of a detection that starts a track."
    )
    match_iou: StrictFloat = Field(
        default=0.2,
        ge=0.01,
        le=1.0,
        description="Least IoU between a strong detection and a track's predicted box to match.",
    )
    lost_track_buffer: StrictInt = Field(
        default=30,
        ge=0,
        le=3000,
        description="Frames a track is kept while unseen, so that it resumes with its id after "
        "an occlusion; then it ends (zone_exit events for the zones it was in).",
    )
    min_hits: StrictInt = Field(
        default=1,
        ge=1,
        le=100,
        description="Frames a new track must be matched on before it gets an id (1: at once).",
    )
    class_aware: StrictBool = Field(
        default=True, description="Only match detections to tracks of the same class."
    )


Coordinate = Annotated[float, Field(strict=True, allow_inf_nan=False)]
Point = tuple[Coordinate, Coordinate]


class ZoneBody(Strict):
    """A polygon zone, a counting line or a mask, without its id (the body of PUT
    .../zones/{id})."""

    kind: Literal["polygon", "line", "mask"] = Field(
        description="polygon: zone_enter / zone_exit events and per-class counts; line: "
        "line_cross events with a direction; mask: detections whose anchor lies inside are "
        "dropped before tracking (a parked car, a poster, a screen that shows people): no "
        "track, no event, not in the results."
    )
    points: list[Point] = Field(
        min_length=2,
        max_length=MAX_POLYGON_POINTS,
        description="[[x, y], ...]: a line's two ends, or a polygon's 3 to 64 vertices in "
        "order (closed implicitly; must not cross itself). Line direction: crossing from "
        "the left to the right of first -> second point, as seen on the image, is 'in'.",
        examples=[[[0.1, 0.5], [0.9, 0.5]]],
    )
    normalized: StrictBool = Field(
        default=True,
        description="true: coordinates are fractions 0..1 of the frame's width and height; "
        "false: source pixels.",
    )
    classes: list[ClassRef] | None = Field(
        default=None,
        min_length=1,
        max_length=1000,
        description="Only count (a mask: only drop) these classes (names or ids); null: every "
        "class.",
    )
    anchor: Literal["center", "bottom_center"] = Field(
        default="center",
        description="The point of a box that must be inside the zone (or the mask) or cross "
        "the line.",
    )

    @model_validator(mode="after")
    def _geometry(self) -> ZoneBody:
        limit = 1.0 if self.normalized else MAX_PIXEL_COORD
        unit = "normalised (0..1)" if self.normalized else f"pixel (0..{MAX_PIXEL_COORD:g})"
        for i, (x, y) in enumerate(self.points):
            if not (0.0 <= x <= limit and 0.0 <= y <= limit):
                raise ValueError(f"point {i} ({x:g}, {y:g}) is outside the {unit} range")
        if self.kind == "line":
            if len(self.points) != 2:
                raise ValueError(f"a line has exactly 2 points, got {len(self.points)}")
            if self.points[0] == self.points[1]:
                raise ValueError("a line's two points must differ")
            return self
        if len(self.points) < 3:
            raise ValueError(f"a polygon needs at least 3 points, got {len(self.points)}")
        # Normalised points are checked on a 10000-unit frame: the geometry's tolerances are
        # absolute (fractions of a pixel).
        pts = np.asarray(self.points, np.float64) * (1e4 if self.normalized else 1.0)
        if (edges := self_intersection(pts.tolist())) is not None:
            raise ValueError(
                f"the polygon crosses itself: edge {edges[0]} (point {edges[0]} -> "
                f"{(edges[0] + 1) % len(self.points)}) meets edge {edges[1]}; list the "
                "points in order around the zone"
            )
        if abs(polygon_area(pts)) < 1.0:
            raise ValueError("the polygon has no area (its points are collinear or repeated)")
        return self


class ZoneSpec(ZoneBody):
    """A polygon zone, a counting line or a mask of one stream."""

    id: str = Field(
        pattern=ZONE_ID_PATTERN,
        description="Zone id, unique within the stream: 1-64 letters, digits, '_', '.', '-'.",
        examples=["entrance"],
    )


def _unique_ids(zones: list[ZoneSpec]) -> list[ZoneSpec]:
    seen: set[str] = set()
    for zone in zones:
        if zone.id in seen:
            raise ValueError(f"zone id {zone.id!r} appears more than once")
        seen.add(zone.id)
    return zones


ZoneList = Annotated[
    list[ZoneSpec],
    Field(max_length=MAX_ZONES, description=f"Zones, lines and masks (at most {MAX_ZONES})."),
    AfterValidator(_unique_ids),
]
