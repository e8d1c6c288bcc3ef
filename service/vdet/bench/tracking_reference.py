"""The plain NumPy tracker and zone monitor that the compiled ones replaced.

`ReferenceByteTracker` and `ReferenceZoneMonitor` are the previous implementations of
`vdet.tracking.bytetrack.ByteTracker` and `vdet.tracking.zones.ZoneMonitor`, unchanged: about a
hundred small NumPy calls and per-track Python a frame. They are kept as the specification the
compiled ones are tested against (the same ids, started and ended tracks and events, frame by
frame) and as `vdet bench tracking`'s baseline, measured in the same run. Nothing serves with
them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from scipy.optimize import linear_sum_assignment

from vdet.core.geometry import Points, Polygon, segments_intersect, side_of_line
from vdet.core.types import (
    NO_TRACK,
    CrossDirection,
    Detections,
    FloatArray,
    ZoneEvent,
    ZoneOccupancy,
)
from vdet.tracking.bytetrack import TrackerParams, TrackUpdate, box_iou
from vdet.tracking.zones import Zone

_ALPHA = np.float32(0.85)
_BETA = np.float32(0.3)
_BIG_COST = 1e6


def _match(iou: FloatArray, min_iou: float) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """Rows and columns of the assignment maximising total IoU, pairs under min_iou dropped."""
    if iou.size == 0:
        empty = np.zeros(0, np.intp)
        return empty, empty
    cost = np.where(iou >= min_iou, 1.0 - iou, _BIG_COST)
    rows, cols = linear_sum_assignment(cost)
    ok = cost[rows, cols] < _BIG_COST
    return rows[ok], cols[ok]


class ReferenceByteTracker:
    """`vdet.tracking.bytetrack.ByteTracker` as NumPy calls (see the module docstring)."""

    # Columns of the two track tables: one float and one int array, so that predicting,
    # adding and dropping tracks is one NumPy call per table, not one per field.
    _BOX, _VEL = slice(0, 4), slice(4, 8)  # the filter's box (xyxy) and per-frame velocity
    _CLS, _ID, _HITS, _LOST = 0, 1, 2, 3  # class, id (NO_TRACK until confirmed), frames
    # matched, frames since last matched (0: seen on the previous frame)

    def __init__(self, params: TrackerParams | None = None) -> None:
        self.params = params or TrackerParams()
        self._next_id = 1
        self._f = np.zeros((0, 8), np.float32)
        self._i = np.zeros((0, 4), np.int32)

    def __len__(self) -> int:
        """Live tracks, lost ones and not yet confirmed ones included."""
        return len(self._i)

    def update(self, detections: Detections) -> TrackUpdate:
        p = self.params
        n, t = len(detections), len(self._i)
        tracker_id = np.full(n, NO_TRACK, np.int32)
        scores, classes = detections.scores, detections.class_ids
        det_box = detections.xyxy
        f, i = self._f, self._i
        f[:, self._BOX] += f[:, self._VEL]  # predict every track one frame ahead
        strong = scores >= p.track_threshold
        track_det = np.full(t, -1, np.intp)  # the detection each track got
        claimed = np.zeros(n, np.bool_)

        if t and n:
            # 1. strong detections against every track, seen or lost
            iou = box_iou(det_box, f[:, self._BOX])  # both stages take their part of it
            if p.class_aware:
                iou *= classes[:, None] == i[:, self._CLS]
            high = np.flatnonzero(strong)
            rows, cols = _match(iou[high], p.match_iou)
            track_det[cols] = high[rows]
            claimed[high[rows]] = True
            # 2. weak detections against tracks seen on the previous frame, still unmatched
            low = np.flatnonzero(~strong)
            if len(low):
                candidates = np.flatnonzero((track_det < 0) & (i[:, self._LOST] == 0))
                if len(candidates):
                    rows, cols = _match(iou[np.ix_(low, candidates)], p.low_match_iou)
                    track_det[candidates[cols]] = low[rows]

        ended: tuple[int, ...] = ()
        started: tuple[int, ...] = ()
        if t:
            matched = track_det >= 0
            dets = track_det[matched]
            residual = det_box[dets] - f[matched, self._BOX]
            f[matched] += np.concatenate([_ALPHA * residual, _BETA * residual], axis=1)
            i[matched, self._CLS] = classes[dets]
            i[:, self._HITS] += matched
            i[:, self._LOST] = np.where(matched, 0, i[:, self._LOST] + 1)
            f[i[:, self._LOST] > 1, self._VEL] *= np.float32(0.9)  # lost: slow down, drift less
            # confirm tracks that reached min_hits; unconfirmed ones die when they miss a frame
            unconfirmed = i[:, self._ID] == NO_TRACK
            started = self._assign_ids(unconfirmed & matched & (i[:, self._HITS] >= p.min_hits))
            tracker_id[dets] = i[matched, self._ID]
            expired = (i[:, self._LOST] > p.lost_track_buffer) | (unconfirmed & ~matched)
            if expired.any():
                ids = i[expired, self._ID]
                ended = tuple(ids[ids != NO_TRACK].tolist())
                self._f, self._i = f[~expired], i[~expired]

        # 3. new tracks from strong detections nobody claimed
        fresh = np.flatnonzero(~claimed & (scores >= max(p.new_track_threshold, p.track_threshold)))
        if len(fresh):
            k = len(fresh)
            new_f = np.zeros((k, 8), np.float32)
            new_f[:, self._BOX] = det_box[fresh]
            new_i = np.zeros((k, 4), np.int32)
            new_i[:, self._CLS] = classes[fresh]
            new_i[:, self._ID] = NO_TRACK
            new_i[:, self._HITS] = 1
            self._f = np.concatenate([self._f, new_f])
            self._i = np.concatenate([self._i, new_i])
            new = np.zeros(len(self._i), np.bool_)
            new[-k:] = p.min_hits <= 1
            started += self._assign_ids(new)
            tracker_id[fresh] = self._i[-k:, self._ID]
        return TrackUpdate(tracker_id, started, ended)

    def _assign_ids(self, rows: npt.NDArray[np.bool_]) -> tuple[int, ...]:
        count = int(np.count_nonzero(rows))
        if not count:
            return ()
        self._i[rows, self._ID] = np.arange(self._next_id, self._next_id + count, dtype=np.int32)
        self._next_id += count
        return tuple(self._i[rows, self._CLS].tolist())


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


class ReferenceZoneMonitor:
    """`vdet.tracking.zones.ZoneMonitor` as NumPy calls and Python loops."""

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
