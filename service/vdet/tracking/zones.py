"""Zones and lines of one stream, and the events tracks make with them.

`resolve_zones` turns validated specs into `Zone`s (class names -> model ids); `ZoneMonitor`
follows tracks through them frame by frame and says who entered, left or crossed, and how many
of each class are inside each polygon now. A track is in a zone while its anchor point is
inside or on the border; it leaves when it is seen outside, or when the tracker ends it (then
the exit is reported on the frame the track ended). A line is crossed when a track's anchor,
last seen strictly on one side, is next seen strictly on the other and its path between the
two meets the line segment: touching the line, or passing beyond its ends, is not a crossing.

This module owns that per-zone state of one stream and nothing else; the caller serialises
calls, in frame order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from vdet.tracking.geometry import Points, Polygon, segments_intersect, side_of_line
from vdet.tracking.specs import ZoneSpec
from vdet.types import (
    NO_TRACK,
    CrossDirection,
    Detections,
    ZoneEvent,
    ZoneOccupancy,
)

ClassResolver = Callable[[Sequence[str | int] | None], frozenset[int] | None]


@dataclass(frozen=True)
class Zone:
    """A zone ready to use: class filter as model ids, points as given (see `pixels`)."""

    id: str
    kind: str  # "polygon" | "line"
    points: tuple[tuple[float, float], ...]
    normalized: bool
    classes: frozenset[int] | None
    anchor: str  # "center" | "bottom_center"

    def pixels(self, size_wh: tuple[int, int]) -> Points:
        pts = np.asarray(self.points, np.float64)
        if self.normalized:
            pts = pts * np.asarray(size_wh, np.float64)
        return pts


def resolve_zones(specs: Iterable[ZoneSpec], resolve_classes: ClassResolver) -> tuple[Zone, ...]:
    """Specs -> zones; ValueError naming the zone for unknown class names."""
    zones = []
    for spec in specs:
        try:
            classes = resolve_classes(spec.classes)
        except ValueError as exc:
            raise ValueError(f"zone {spec.id!r}: {exc}") from None
        zones.append(
            Zone(
                id=spec.id,
                kind=spec.kind,
                points=tuple((float(x), float(y)) for x, y in spec.points),
                normalized=spec.normalized,
                classes=classes,
                anchor=spec.anchor,
            )
        )
    return tuple(zones)


def check_in_frame(specs: Iterable[ZoneSpec], size_wh: tuple[int, int]) -> None:
    """ValueError for a pixel zone with a point outside a frame of `size_wh`."""
    w, h = size_wh
    for spec in specs:
        if spec.normalized:
            continue
        for i, (x, y) in enumerate(spec.points):
            if x > w or y > h:
                raise ValueError(
                    f"zone {spec.id!r}: point {i} ({x:g}, {y:g}) is outside the stream's "
                    f"{w}x{h} frame"
                )


def anchors(boxes: np.ndarray, anchor: str) -> Points:
    """The anchor point of each xyxy box."""
    x = (boxes[:, 0] + boxes[:, 2]) * 0.5
    y = boxes[:, 3] if anchor == "bottom_center" else (boxes[:, 1] + boxes[:, 3]) * 0.5
    out: Points = np.stack([x, y], axis=1).astype(np.float64)
    return out


@dataclass
class _ZoneState:
    # Polygons, by track id of the tracks inside: when each entered, was last seen inside,
    # and its class. Three flat dicts so that a frame's updates are dict.update calls.
    entered_s: dict[int, float] = field(default_factory=dict)
    last_seen_s: dict[int, float] = field(default_factory=dict)
    class_of: dict[int, int] = field(default_factory=dict)
    sides: dict[int, tuple[int, float, float]] = field(default_factory=dict)  # lines
    classes_seen: set[int] = field(default_factory=set)
    polygon: tuple[tuple[int, int], Polygon] | None = None  # in pixels, for this frame size


class ZoneMonitor:
    """Per-zone state of one stream's tracks. Call `update` once per frame, in order."""

    def __init__(self) -> None:
        self._zones: tuple[Zone, ...] = ()
        self._state: dict[str, _ZoneState] = {}

    @property
    def zones(self) -> tuple[Zone, ...]:
        return self._zones

    def set_zones(self, zones: tuple[Zone, ...]) -> None:
        """Use `zones` from now on. A zone kept unchanged keeps its state; a new or changed
        one starts empty (tracks already inside a new zone enter it on the next frame)."""
        if zones == self._zones:
            return
        old = {z.id: z for z in self._zones}
        self._state = {
            z.id: self._state[z.id] if old.get(z.id) == z and z.id in self._state else _ZoneState()
            for z in zones
        }
        self._zones = zones

    def update(
        self,
        detections: Detections,
        size_wh: tuple[int, int],
        time_s: float,
        ended_ids: Sequence[int] = (),
    ) -> tuple[tuple[ZoneEvent, ...], tuple[ZoneOccupancy, ...]]:
        """Events of this frame and the polygons' occupancy after it.

        `detections` must carry tracker ids; `ended_ids` are tracks the tracker ended now.
        """
        if not self._zones:
            return (), ()
        ids = detections.tracker_id
        tracked = np.zeros(len(detections), np.bool_) if ids is None else ids != NO_TRACK
        boxes = detections.xyxy[tracked]
        track_ids = [] if ids is None else ids[tracked].tolist()
        classes = detections.class_ids[tracked]
        anchor_points = {a: anchors(boxes, a) for a in {z.anchor for z in self._zones}}
        events: list[ZoneEvent] = []
        occupancy: list[ZoneOccupancy] = []
        ended = set(ended_ids)
        every_row = np.arange(len(track_ids))
        for zone in self._zones:
            state = self._state[zone.id]
            if zone.classes is None:
                rows, points = every_row, anchor_points[zone.anchor]
            else:
                rows = np.flatnonzero(np.isin(classes, list(zone.classes)))
                points = anchor_points[zone.anchor][rows]
            if zone.kind == "line":
                self._lines(zone, state, size_wh, points, rows, track_ids, classes, events)
                for track_id in ended:
                    state.sides.pop(track_id, None)
                continue
            if state.polygon is None or state.polygon[0] != size_wh:
                state.polygon = size_wh, Polygon(zone.pixels(size_wh))
            inside = state.polygon[1].contains(points)
            ids_here = [track_ids[r] for r in rows.tolist()]
            inside_list = inside.tolist()
            in_ids = [t for t, i in zip(ids_here, inside_list, strict=True) if i]
            in_classes = classes[rows[inside]].tolist()
            for track_id, class_id in zip(in_ids, in_classes, strict=True):
                if track_id not in state.entered_s:
                    state.entered_s[track_id] = time_s
                    events.append(ZoneEvent("zone_enter", zone.id, track_id, class_id))
            state.last_seen_s.update(dict.fromkeys(in_ids, time_s))
            state.class_of.update(zip(in_ids, in_classes, strict=True))
            left = {t for t, i in zip(ids_here, inside_list, strict=True) if not i}
            for track_id in sorted((left | ended) & state.entered_s.keys()):
                events.append(self._exit(zone, state, track_id))
            counts = dict.fromkeys(state.classes_seen, 0) | Counter(state.class_of.values())
            state.classes_seen.update(counts)
            occupancy.extend(ZoneOccupancy(zone.id, c, n) for c, n in sorted(counts.items()))
        return tuple(events), tuple(occupancy)

    @staticmethod
    def _exit(zone: Zone, state: _ZoneState, track_id: int) -> ZoneEvent:
        entered = state.entered_s.pop(track_id)
        dwell = round(max(0.0, state.last_seen_s.pop(track_id) - entered), 6)
        class_id = state.class_of.pop(track_id)
        return ZoneEvent("zone_exit", zone.id, track_id, class_id, dwell_s=dwell)

    @staticmethod
    def _lines(
        zone: Zone,
        state: _ZoneState,
        size_wh: tuple[int, int],
        points: Points,
        rows: np.ndarray,
        track_ids: list[int],
        classes: np.ndarray,
        events: list[ZoneEvent],
    ) -> None:
        ends = zone.pixels(size_wh)
        a, b = ends[0], ends[1]
        sides = side_of_line(points, a, b).tolist()
        ids = [track_ids[r] for r in rows.tolist()]
        rows_classes = classes[rows].tolist()
        # On the line (side 0): on neither side yet, the last side seen stands.
        seen = [
            (t, s, p, c)
            for t, s, p, c in zip(ids, sides, points.tolist(), rows_classes, strict=True)
            if s
        ]
        get = state.sides.get
        for track_id, side, (x, y), class_id in seen:
            previous = get(track_id)
            if previous is None or previous[0] == side:
                continue
            start, end = np.asarray([previous[1:]]), np.asarray([[x, y]])
            if segments_intersect(start, end, a, b)[0]:
                direction: CrossDirection = "in" if previous[0] < 0 else "out"
                events.append(ZoneEvent("line_cross", zone.id, track_id, class_id, direction))
        state.sides.update((t, (s, p[0], p[1])) for t, s, p, _ in seen)
