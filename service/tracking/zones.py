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
import numpy.typing as npt

from vdet.tracking import compiled
from vdet.tracking.compiled import INSIDE, NOT_COUNTED, OUTSIDE
from vdet.tracking.geometry import Points, segments_intersect
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


@dataclass
class _ZoneState:
    # Polygons, by track id of the tracks inside: when each entered, was last seen inside,
    # and its class. Three flat dicts so that a frame's updates are dict.update calls.
    entered_s: dict[int, float] = field(default_factory=dict)
    last_seen_s: dict[int, float] = field(default_factory=dict)
    class_of: dict[int, int] = field(default_factory=dict)
    sides: dict[int, tuple[int, float, float]] = field(default_factory=dict)  # lines
    classes_seen: set[int] = field(default_factory=set)


@dataclass(frozen=True)
class _PackedZones:
    """The zones of one frame size as the arrays `compiled.zone_tests` reads."""

    size_wh: tuple[int, int]
    kinds: npt.NDArray[np.int8]  # 0 polygon, 1 line
    anchors: npt.NDArray[np.int8]  # 0 center, 1 bottom center
    vertices: npt.NDArray[np.float64]  # (zones, most vertices, 2) pixels
    vertex_counts: npt.NDArray[np.int64]
    class_filter: npt.NDArray[np.bool_]  # (zones, largest class id + 1)
    filtered: npt.NDArray[np.bool_]  # (zones,) whether the zone has a class filter
    line_ends: tuple[tuple[Points, Points] | None, ...]  # a line's two ends, for crossings

    @classmethod
    def of(cls, zones: tuple[Zone, ...], size_wh: tuple[int, int]) -> _PackedZones:
        pixels = [z.pixels(size_wh) for z in zones]
        vertices = np.zeros((len(zones), max(len(p) for p in pixels), 2), np.float64)
        for row, pts in zip(vertices, pixels, strict=True):
            row[: len(pts)] = pts
        width = 1 + max((max(z.classes) for z in zones if z.classes), default=0)
        class_filter = np.zeros((len(zones), width), np.bool_)
        for wanted, zone in zip(class_filter, zones, strict=True):
            wanted[list(zone.classes or ())] = True
        return cls(
            size_wh=size_wh,
            kinds=np.asarray([z.kind == "line" for z in zones], np.int8),
            anchors=np.asarray([z.anchor == "bottom_center" for z in zones], np.int8),
            vertices=vertices,
            vertex_counts=np.asarray([len(p) for p in pixels], np.int64),
            class_filter=class_filter,
            filtered=np.asarray([z.classes is not None for z in zones], np.bool_),
            line_ends=tuple(
                (p[0], p[1]) if z.kind == "line" else None
                for z, p in zip(zones, pixels, strict=True)
            ),
        )


class ZoneMonitor:
    """Per-zone state of one stream's tracks. Call `update` once per frame, in order.

    Where each track stands with each zone is one compiled pass over tracks x zones
    (vdet.tracking.compiled); what follows from it (events, dwell, counts) is plain Python
    over the tracks of each zone, and events are built only when they happen.
    """

    def __init__(self) -> None:
        self._zones: tuple[Zone, ...] = ()
        self._state: dict[str, _ZoneState] = {}
        self._packed: _PackedZones | None = None

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
        self._packed = None

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
        packed = self._packed
        if packed is None or packed.size_wh != size_wh:
            packed = self._packed = _PackedZones.of(self._zones, size_wh)
        ids = detections.tracker_id
        if ids is None:
            ids = np.full(len(detections), NO_TRACK, np.int32)
        tests, points = compiled.zone_tests(
            detections.xyxy,
            detections.class_ids,
            ids,
            packed.kinds,
            packed.anchors,
            packed.vertices,
            packed.vertex_counts,
            packed.class_filter,
            packed.filtered,
        )
        track_ids = ids.tolist()
        classes = detections.class_ids.tolist()
        anchor_points: list[list[list[float]]] | None = None
        events: list[ZoneEvent] = []
        occupancy: list[ZoneOccupancy] = []
        ended = set(ended_ids)
        for zone, row, ends in zip(self._zones, tests.tolist(), packed.line_ends, strict=True):
            state = self._state[zone.id]
            if ends is not None:
                if anchor_points is None:
                    anchor_points = points.tolist()
                here = anchor_points[zone.anchor == "bottom_center"]
                self._lines(zone, state, ends, row, here, track_ids, classes, events)
                for track_id in ended:
                    state.sides.pop(track_id, None)
                continue
            inside = [
                (t, c) for t, v, c in zip(track_ids, row, classes, strict=True) if v == INSIDE
            ]
            entered = state.entered_s
            for track_id, class_id in inside:
                if track_id not in entered:
                    entered[track_id] = time_s
                    events.append(ZoneEvent("zone_enter", zone.id, track_id, class_id))
            state.last_seen_s.update(dict.fromkeys([t for t, _ in inside], time_s))
            state.class_of.update(inside)
            left = {t for t, v in zip(track_ids, row, strict=True) if v == OUTSIDE}
            for track_id in sorted((left | ended) & entered.keys()):
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
        ends: tuple[Points, Points],
        sides: list[int],
        points: list[list[float]],
        track_ids: list[int],
        classes: list[int],
        events: list[ZoneEvent],
    ) -> None:
        a, b = ends
        last = state.sides
        for track_id, side, (x, y), class_id in zip(track_ids, sides, points, classes, strict=True):
            # On the line (side 0): on neither side yet, the last side seen stands.
            if side == 0 or side == NOT_COUNTED:
                continue
            previous = last.get(track_id)
            last[track_id] = (side, x, y)
            if previous is None or previous[0] == side:
                continue
            start, end = np.asarray([previous[1:]]), np.asarray([[x, y]])
            if segments_intersect(start, end, a, b)[0]:
                direction: CrossDirection = "in" if previous[0] < 0 else "out"
                events.append(ZoneEvent("line_cross", zone.id, track_id, class_id, direction))
