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

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from vdet.config.tracking import ZoneSpec
from vdet.core.geometry import Points
from vdet.core.types import (
    NO_TRACK,
    Detections,
    ZoneEvent,
    ZoneOccupancy,
)
from vdet.tracking import compiled

_NO_IDS = np.zeros(0, np.int64)

ClassResolver = Callable[[Sequence[str | int] | None], frozenset[int] | None]


@dataclass(frozen=True)
class Zone:
    """A zone ready to use: class filter as model ids, points as given (see `pixels`)."""

    id: str
    kind: str  # "polygon" | "line" | "mask" (vdet.tracking.masks; never in a ZoneMonitor)
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


def _ids(rows: int) -> npt.NDArray[np.int64]:
    return np.zeros(rows, np.int64)


def _times(rows: int) -> npt.NDArray[np.float64]:
    return np.zeros(rows, np.float64)


@dataclass
class _ZoneState:
    """One zone's tracks, as the arrays `compiled.polygon_step` / `line_step` update in place:
    their first `size[0]` rows are the tracks inside a polygon (id, class, when it entered,
    last seen inside) or last seen off a line (id, side, anchor point)."""

    members: npt.NDArray[np.int64] = field(default_factory=lambda: _ids(16))
    member_class: npt.NDArray[np.int64] = field(default_factory=lambda: _ids(16))
    entered_s: npt.NDArray[np.float64] = field(default_factory=lambda: _times(16))
    last_seen_s: npt.NDArray[np.float64] = field(default_factory=lambda: _times(16))
    member_side: npt.NDArray[np.int8] = field(default_factory=lambda: np.zeros(16, np.int8))
    member_xy: npt.NDArray[np.float64] = field(default_factory=lambda: np.zeros((16, 2)))
    size: npt.NDArray[np.int64] = field(default_factory=lambda: _ids(1))
    classes_seen: set[int] = field(default_factory=set)  # polygons: every class ever inside,
    occupancy: tuple[ZoneOccupancy, ...] = ()  # and the counts as last reported

    def make_room(self, boxes: int) -> None:
        """Room for `boxes` more members (each box of a frame may add one)."""
        rows = int(self.size[0]) + boxes
        if rows <= len(self.members):
            return
        rows = max(rows, 2 * len(self.members))
        grow = rows - len(self.members)
        self.members = np.concatenate([self.members, _ids(grow)])
        self.member_class = np.concatenate([self.member_class, _ids(grow)])
        self.entered_s = np.concatenate([self.entered_s, _times(grow)])
        self.last_seen_s = np.concatenate([self.last_seen_s, _times(grow)])
        self.member_side = np.concatenate([self.member_side, np.zeros(grow, np.int8)])
        self.member_xy = np.concatenate([self.member_xy, np.zeros((grow, 2))])


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
    line_ends: tuple[Points | None, ...]  # a line's two ends (2, 2), pixels

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
                p if z.kind == "line" else None for z, p in zip(zones, pixels, strict=True)
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
        ids = np.full(len(detections), NO_TRACK, np.int32) if ids is None else ids
        # the types `compiled.warm_up` builds for (see ByteTracker.update)
        ids = np.ascontiguousarray(ids, np.int32)
        classes = np.ascontiguousarray(detections.class_ids, np.int32)
        tests, points = compiled.zone_tests(
            np.ascontiguousarray(detections.xyxy, np.float32),
            classes,
            ids,
            packed.kinds,
            packed.anchors,
            packed.vertices,
            packed.vertex_counts,
            packed.class_filter,
            packed.filtered,
        )
        ended = np.asarray(ended_ids, np.int64) if ended_ids else _NO_IDS
        events: list[ZoneEvent] = []
        occupancy: list[ZoneOccupancy] = []
        for z, (zone, ends) in enumerate(zip(self._zones, packed.line_ends, strict=True)):
            state = self._state[zone.id]
            state.make_room(len(ids))
            if ends is not None:
                tracks, track_classes, came_from = compiled.line_step(
                    tests,
                    z,
                    ids,
                    classes,
                    points[packed.anchors[z]],
                    ends,
                    ended,
                    state.members,
                    state.member_side,
                    state.member_xy,
                    state.size,
                )
                if len(tracks):
                    events.extend(
                        ZoneEvent("line_cross", zone.id, t, c, "in" if f < 0 else "out")
                        for t, c, f in zip(
                            tracks.tolist(), track_classes.tolist(), came_from.tolist(), strict=True
                        )
                    )
                continue
            tracks, track_classes, entered_s, last_seen_s, enters, changed = compiled.polygon_step(
                tests,
                z,
                ids,
                classes,
                ended,
                time_s,
                state.members,
                state.member_class,
                state.entered_s,
                state.last_seen_s,
                state.size,
            )
            if len(tracks):
                rows = zip(
                    tracks.tolist(),
                    track_classes.tolist(),
                    entered_s.tolist(),
                    last_seen_s.tolist(),
                    strict=True,
                )
                for k, (track_id, class_id, entered, last_seen) in enumerate(rows):
                    if k < enters:
                        events.append(ZoneEvent("zone_enter", zone.id, track_id, class_id))
                    else:
                        dwell = round(max(0.0, last_seen - entered), 6)
                        exit_ = ZoneEvent("zone_exit", zone.id, track_id, class_id, dwell_s=dwell)
                        events.append(exit_)
            if changed:
                self._count(zone, state)
            occupancy.extend(state.occupancy)
        return tuple(events), tuple(occupancy)

    @staticmethod
    def _count(zone: Zone, state: _ZoneState) -> None:
        """Tracks in the zone per class, zeros for the classes seen there before."""
        inside = state.member_class[: int(state.size[0])].tolist()
        state.classes_seen.update(inside)
        counts = dict.fromkeys(state.classes_seen, 0)
        for class_id in inside:
            counts[class_id] += 1
        state.occupancy = tuple(ZoneOccupancy(zone.id, c, n) for c, n in sorted(counts.items()))
