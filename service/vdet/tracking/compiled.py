"""The per-frame inner loops of tracking, compiled with Numba: association (and the assignment
problems of ambiguous frames, which SciPy solves), the track filter's update, the zone and
line tests, and each zone's members.

At 30 objects a frame's tracking is a few thousand multiply-adds; written as NumPy calls it
costs about a hundred calls of 1-2 us each, mostly call overhead. Here each stage is one
compiled call over the same struct-of-arrays track table (`ByteTracker`'s), so a frame costs
a few microseconds of arithmetic and a handful of calls. The functions are compiled on first
use and cached beside this module (or in the user's cache when that is read-only): the first
frame a process tracks waits for that once (`warm_up` does it beforehand).

Every function is pure arithmetic on arrays the caller owns: the tracker's rules (what
matches, what starts or ends a track) and the zones' rules are the ones the callers' docstrings
state; they live here only as loops. Nothing here knows about streams or threads, and no
event object is built here: events come back as rows of plain numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numba import njit

# The track table's int columns (ByteTracker owns their meaning).
CLS, ID, HITS, LOST = 0, 1, 2, 3
NO_TRACK = -1
# Zone tests: one row per zone, one column per tracked object.
OUTSIDE, INSIDE, NOT_COUNTED = 0, 1, 2  # polygons; lines give -1, 0, +1 (side) or NOT_COUNTED
_EPS = 1e-9
BIG_COST = np.float32(1e6)  # an assignment's cost for a pair that must not match


def _compile(function: Callable[..., Any]) -> Any:
    """`function` compiled on its first call, the machine code cached for later processes."""
    try:
        return njit(cache=True, nogil=True, error_model="numpy")(function)
    except RuntimeError:  # no writable cache directory (a read-only install): every process
        return njit(nogil=True, error_model="numpy")(function)  # compiles on first use


def _associate(
    f: Any,
    ti: Any,
    t: int,
    xyxy: Any,
    scores: Any,
    classes: Any,
    class_aware: bool,
    track_threshold: Any,
    match_iou: Any,
    low_match_iou: Any,
) -> tuple[Any, Any, bool]:
    """Predict the first `t` tracks one frame ahead, their IoU with each detection (0 across
    classes when `class_aware`), and the matches when they are unambiguous.

    Returns (iou (n, t) float32, track_det (t,) detection of each track or -1, unique). When
    every detection has at most one acceptable track and every track at most one acceptable
    detection (strong: IoU >= match_iou with any track; weak: IoU >= low_match_iou with a
    track seen on the previous frame), ByteTrack's two optimal assignments take exactly those
    pairs, so they are the answer. Otherwise `unique` is False and track_det is not set: the
    caller runs the assignments on `iou`.
    """
    n = xyxy.shape[0]
    for k in range(t):
        for c in range(4):
            f[k, c] += f[k, 4 + c]
    iou = np.zeros((n, t), np.float32)
    track_det = np.full(t, -1, np.intp)
    det_track = np.full(n, -1, np.intp)
    unique = True
    for d in range(n):
        ax1, ay1, ax2, ay2 = xyxy[d, 0], xyxy[d, 1], xyxy[d, 2], xyxy[d, 3]
        area_a = (ax2 - ax1) * (ay2 - ay1)
        strong = scores[d] >= track_threshold
        least = match_iou if strong else low_match_iou
        for k in range(t):
            if class_aware and classes[d] != ti[k, CLS]:
                continue
            iw = min(ax2, f[k, 2]) - max(ax1, f[k, 0])
            ih = min(ay2, f[k, 3]) - max(ay1, f[k, 1])
            if iw <= 0 or ih <= 0:
                continue
            inter = iw * ih
            union = area_a + ((f[k, 2] - f[k, 0]) * (f[k, 3] - f[k, 1]) - inter)
            value = np.float32(inter / max(union, np.float32(1e-9)))
            iou[d, k] = value
            if value >= least and (strong or ti[k, LOST] == 0):
                if det_track[d] >= 0 or track_det[k] >= 0:
                    unique = False
                det_track[d] = k
                track_det[k] = d
    return iou, track_det, unique


def _apply(
    f: Any,
    ti: Any,
    t: int,
    track_det: Any,
    xyxy: Any,
    scores: Any,
    classes: Any,
    alpha: Any,
    beta: Any,
    min_hits: int,
    lost_track_buffer: int,
    start_threshold: Any,
    next_id: int,
) -> tuple[Any, Any, Any, int, int]:
    """Apply a frame's matches to the table's first `t` rows, end and compact the expired
    tracks, append a track per unclaimed detection scoring >= start_threshold (the table has
    room for `t + n` rows), and number confirmed tracks from `next_id`.

    Returns (tracker_id (n,), started classes, ended ids, rows now live, next id).
    """
    n = xyxy.shape[0]
    tracker_id = np.full(n, NO_TRACK, np.int32)
    claimed = np.zeros(n, np.bool_)
    started = np.empty(t + n, np.int32)
    ended = np.empty(t, np.int32)
    n_started = 0
    n_ended = 0
    live = 0
    for k in range(t):
        d = track_det[k]
        unconfirmed = ti[k, ID] == NO_TRACK
        if d >= 0:
            for c in range(4):
                residual = xyxy[d, c] - f[k, c]
                f[k, c] += alpha * residual
                f[k, 4 + c] += beta * residual
            ti[k, CLS] = classes[d]
            ti[k, HITS] += 1
            ti[k, LOST] = 0
            claimed[d] = True
            if unconfirmed and ti[k, HITS] >= min_hits:
                ti[k, ID] = next_id
                next_id += 1
                started[n_started] = ti[k, CLS]
                n_started += 1
            tracker_id[d] = ti[k, ID]
        else:
            ti[k, LOST] += 1
            if ti[k, LOST] > 1:  # lost: slow down, drift less
                for c in range(4, 8):
                    f[k, c] *= np.float32(0.9)
        expired = ti[k, LOST] > lost_track_buffer or (unconfirmed and d < 0)
        if expired:
            if ti[k, ID] != NO_TRACK:
                ended[n_ended] = ti[k, ID]
                n_ended += 1
            continue
        if live != k:
            f[live] = f[k]
            ti[live] = ti[k]
        live += 1
    for d in range(n):
        if claimed[d] or scores[d] < start_threshold:
            continue
        f[live, :4] = xyxy[d]
        f[live, 4:] = 0
        ti[live, CLS] = classes[d]
        ti[live, ID] = NO_TRACK
        ti[live, HITS] = 1
        ti[live, LOST] = 0
        if min_hits <= 1:
            ti[live, ID] = next_id
            next_id += 1
            started[n_started] = classes[d]
            n_started += 1
        tracker_id[d] = ti[live, ID]
        live += 1
    return tracker_id, started[:n_started], ended[:n_ended], live, next_id


def _first_stage_costs(
    iou: Any, scores: Any, track_threshold: Any, match_iou: Any
) -> tuple[Any, Any]:
    """ByteTrack's first assignment problem: strong detections (rows `high`) against every
    track, cost 1 - IoU, or BIG_COST where IoU < match_iou (never a match)."""
    high = np.flatnonzero(scores >= track_threshold)
    cost = np.empty((high.shape[0], iou.shape[1]), np.float32)
    for r in range(high.shape[0]):
        for k in range(iou.shape[1]):
            value = iou[high[r], k]
            cost[r, k] = np.float32(1.0) - value if value >= match_iou else BIG_COST
    return cost, high


def _second_stage_costs(
    iou: Any,
    cost: Any,
    rows: Any,
    cols: Any,
    high: Any,
    scores: Any,
    ti: Any,
    track_threshold: Any,
    low_match_iou: Any,
) -> tuple[Any, Any, Any, Any]:
    """Take the first assignment's matches (`rows`, `cols` of `cost`), then pose the second:
    weak detections (rows `low`) against the tracks still unmatched that were seen on the
    previous frame (columns `candidates`), BIG_COST under low_match_iou.
    Returns (track_det so far, cost, low, candidates)."""
    track_det = np.full(iou.shape[1], -1, np.intp)
    for j in range(rows.shape[0]):
        if cost[rows[j], cols[j]] < BIG_COST:
            track_det[cols[j]] = high[rows[j]]
    low = np.flatnonzero(scores < track_threshold)
    candidates = np.empty(iou.shape[1], np.intp)
    count = 0
    for k in range(iou.shape[1]):
        if track_det[k] < 0 and ti[k, LOST] == 0:
            candidates[count] = k
            count += 1
    candidates = candidates[:count]
    second = np.empty((low.shape[0], count), np.float32)
    for r in range(low.shape[0]):
        for c in range(count):
            value = iou[low[r], candidates[c]]
            second[r, c] = np.float32(1.0) - value if value >= low_match_iou else BIG_COST
    return track_det, second, low, candidates


def _take_second_stage(
    track_det: Any, cost: Any, rows: Any, cols: Any, low: Any, candidates: Any
) -> None:
    for j in range(rows.shape[0]):
        if cost[rows[j], cols[j]] < BIG_COST:
            track_det[candidates[cols[j]]] = low[rows[j]]


def _zone_tests(
    xyxy: Any,
    classes: Any,
    track_ids: Any,
    kinds: Any,
    anchors: Any,
    vertices: Any,
    vertex_counts: Any,
    class_filter: Any,
    filtered: Any,
) -> tuple[Any, Any]:
    """Where each box's anchor stands with each zone.

    Zone z: kinds[z] 0 polygon, 1 line; anchors[z] 0 center, 1 bottom center; its first
    vertex_counts[z] rows of vertices[z] (pixels); when filtered[z], only classes c with
    class_filter[z, c] count. Returns (tests (zones, n) int8: INSIDE/OUTSIDE for polygons (on
    the border is inside), the side of the line for lines (+1 right of first -> second point
    on a y-down image, -1 left, 0 on it), NOT_COUNTED for classes the zone ignores; anchor
    points (2, n, 2): center, bottom center). Boxes on no track (track_ids NO_TRACK) are
    NOT_COUNTED by any zone.
    """
    n = xyxy.shape[0]
    points = np.empty((2, n, 2), np.float64)
    for i in range(n):
        # in the boxes' float32, as the anchors have always been computed
        x = np.float64((xyxy[i, 0] + xyxy[i, 2]) * np.float32(0.5))
        points[0, i, 0] = x
        points[0, i, 1] = np.float64((xyxy[i, 1] + xyxy[i, 3]) * np.float32(0.5))
        points[1, i, 0] = x
        points[1, i, 1] = np.float64(xyxy[i, 3])
    zones = kinds.shape[0]
    tests = np.empty((zones, n), np.int8)
    for z in range(zones):
        v = vertex_counts[z]
        for i in range(n):
            c = classes[i]
            if track_ids[i] == NO_TRACK:
                tests[z, i] = NOT_COUNTED
                continue
            if filtered[z] and (c < 0 or c >= class_filter.shape[1] or not class_filter[z, c]):
                tests[z, i] = NOT_COUNTED
                continue
            px, py = points[anchors[z], i, 0], points[anchors[z], i, 1]
            if kinds[z] == 1:
                ax, ay = vertices[z, 0, 0], vertices[z, 0, 1]
                bx, by = vertices[z, 1, 0], vertices[z, 1, 1]
                cross = (bx - ax) * (py - ay) - (by - ay) * (px - ax)
                tests[z, i] = 0 if abs(cross) <= _EPS else (1 if cross > 0 else -1)
                continue
            crossings = 0
            on_edge = False
            for e in range(v):
                ax, ay = vertices[z, e, 0], vertices[z, e, 1]
                nxt = e + 1 if e + 1 < v else 0
                bx, by = vertices[z, nxt, 0], vertices[z, nxt, 1]
                dy = by - ay
                if (ay > py) != (by > py) and px < ax + (py - ay) * ((bx - ax) / dy):
                    crossings += 1
                cross = (bx - ax) * (py - ay) - dy * (px - ax)
                tolerance = _EPS * max(1.0, abs(bx - ax) + abs(dy))
                if (
                    abs(cross) <= tolerance
                    and min(ax, bx) - _EPS <= px <= max(ax, bx) + _EPS
                    and min(ay, by) - _EPS <= py <= max(ay, by) + _EPS
                ):
                    on_edge = True
            tests[z, i] = INSIDE if on_edge or crossings % 2 == 1 else OUTSIDE
    return tests, points


def _find(ids: Any, size: int, track_id: int) -> int:
    for k in range(size):
        if ids[k] == track_id:
            return k
    return -1


def _polygon_step(
    tests: Any,
    zone: int,
    track_ids: Any,
    classes: Any,
    ended: Any,
    time_s: float,
    members: Any,
    member_class: Any,
    entered_s: Any,
    last_seen_s: Any,
    size: Any,
) -> tuple[Any, Any, Any, Any, int, bool]:
    """One frame of one polygon's members (the tracks inside, by id, in the first size[0] rows
    of members / member_class / entered_s / last_seen_s, which have room for every box).

    A box INSIDE (tests[zone]) whose track is not a member enters (an event) and becomes one;
    a member's last sighting and class follow its boxes inside; a member seen OUTSIDE, or in
    `ended`, exits (events in track id order, after the enters) and is removed.
    Returns (track, class, entered_s, last_seen_s) per event, how many are enters, and whether
    the members or their classes changed.
    """
    n = track_ids.shape[0]
    count = size[0]
    out_track = np.empty(n + count + ended.shape[0], np.int64)
    out_class = np.empty_like(out_track)
    out_entered = np.empty(out_track.shape[0], np.float64)
    out_last = np.empty_like(out_entered)
    events = 0
    changed = False
    leaving = np.zeros(count + n, np.bool_)
    for i in range(n):
        test = tests[zone, i]
        if test == NOT_COUNTED:
            continue
        k = _find(members, count, track_ids[i])
        if test == INSIDE:
            if k < 0:
                k = count
                count += 1
                members[k] = track_ids[i]
                entered_s[k] = time_s
                out_track[events] = track_ids[i]
                out_class[events] = classes[i]
                out_entered[events] = time_s
                out_last[events] = time_s
                events += 1
                changed = True
            elif member_class[k] != classes[i]:
                changed = True
            member_class[k] = classes[i]
            last_seen_s[k] = time_s
        elif k >= 0:
            leaving[k] = True
    for e in range(ended.shape[0]):
        k = _find(members, count, ended[e])
        if k >= 0:
            leaving[k] = True
    enters = events
    exits = np.flatnonzero(leaving[:count])
    if exits.shape[0]:
        changed = True
        for k in exits[np.argsort(members[exits], kind="mergesort")]:
            out_track[events] = members[k]
            out_class[events] = member_class[k]
            out_entered[events] = entered_s[k]
            out_last[events] = last_seen_s[k]
            events += 1
        live = 0
        for k in range(count):
            if leaving[k]:
                continue
            members[live] = members[k]
            member_class[live] = member_class[k]
            entered_s[live] = entered_s[k]
            last_seen_s[live] = last_seen_s[k]
            live += 1
        count = live
    size[0] = count
    return (
        out_track[:events],
        out_class[:events],
        out_entered[:events],
        out_last[:events],
        enters,
        changed,
    )


def _cross(ox: float, oy: float, ax: float, ay: float, bx: float, by: float) -> float:
    return (ax - ox) * (by - oy) - (ay - oy) * (bx - ox)


def _segments_meet(
    px: float, py: float, qx: float, qy: float, ax: float, ay: float, bx: float, by: float
) -> bool:
    """vdet.core.geometry.segments_intersect for one pair of segments."""
    d1, d2 = _cross(ax, ay, bx, by, px, py), _cross(ax, ay, bx, by, qx, qy)
    if abs(d1) <= _EPS and abs(d2) <= _EPS:  # collinear: do their extents overlap
        return (
            min(px, qx) <= max(ax, bx) + _EPS
            and max(px, qx) >= min(ax, bx) - _EPS
            and min(py, qy) <= max(ay, by) + _EPS
            and max(py, qy) >= min(ay, by) - _EPS
        )
    d3, d4 = _cross(px, py, qx, qy, ax, ay), _cross(px, py, qx, qy, bx, by)
    return d1 * d2 <= 0 and d3 * d4 <= 0


def _line_step(
    tests: Any,
    zone: int,
    track_ids: Any,
    classes: Any,
    points: Any,
    ends: Any,
    ended: Any,
    members: Any,
    member_side: Any,
    member_xy: Any,
    size: Any,
) -> tuple[Any, Any, Any]:
    """One frame of one line: the last side (+1/-1) and anchor point each track was seen at
    strictly off the line (first size[0] rows of members / member_side / member_xy, with room
    for every box). A box on the other side than its track's last one, whose anchor's path
    from there meets the segment `ends` (2, 2), crosses it. Tracks in `ended` are forgotten.
    Returns (track, class, side it came from) per crossing, in box order.
    """
    n = track_ids.shape[0]
    count = size[0]
    out_track = np.empty(n, np.int64)
    out_class = np.empty(n, np.int64)
    out_from = np.empty(n, np.int64)
    events = 0
    ax, ay, bx, by = ends[0, 0], ends[0, 1], ends[1, 0], ends[1, 1]
    for i in range(n):
        side = tests[zone, i]
        if side == 0 or side == NOT_COUNTED:  # on the line: the last side seen stands
            continue
        x, y = points[i, 0], points[i, 1]
        k = _find(members, count, track_ids[i])
        if k < 0:
            k = count
            count += 1
            members[k] = track_ids[i]
        elif member_side[k] != side and _segments_meet(
            member_xy[k, 0], member_xy[k, 1], x, y, ax, ay, bx, by
        ):
            out_track[events] = track_ids[i]
            out_class[events] = classes[i]
            out_from[events] = member_side[k]
            events += 1
        member_side[k] = side
        member_xy[k, 0] = x
        member_xy[k, 1] = y
    for e in range(ended.shape[0]):
        k = _find(members, count, ended[e])
        if k >= 0:  # the last row takes its place
            count -= 1
            members[k] = members[count]
            member_side[k] = member_side[count]
            member_xy[k] = member_xy[count]
    size[0] = count
    return out_track[:events], out_class[:events], out_from[:events]


associate: Callable[..., tuple[Any, Any, bool]] = _compile(_associate)
apply: Callable[..., tuple[Any, Any, Any, int, int]] = _compile(_apply)
zone_tests: Callable[..., tuple[Any, Any]] = _compile(_zone_tests)
first_stage_costs: Callable[..., tuple[Any, Any]] = _compile(_first_stage_costs)
second_stage_costs: Callable[..., tuple[Any, Any, Any, Any]] = _compile(_second_stage_costs)
take_second_stage: Callable[..., None] = _compile(_take_second_stage)
_find = _compile(_find)
_cross = _compile(_cross)
_segments_meet = _compile(_segments_meet)
polygon_step: Callable[..., tuple[Any, Any, Any, Any, int, bool]] = _compile(_polygon_step)
line_step: Callable[..., tuple[Any, Any, Any]] = _compile(_line_step)


def warm_up() -> None:
    """Compile every function here (or load it from the cache) for the types the tracker and
    the zone monitor pass, on a one-box frame."""
    f, ti = np.zeros((2, 8), np.float32), np.zeros((2, 4), np.int32)
    xyxy = np.asarray([[0, 0, 10, 10]], np.float32)
    scores, classes = np.ones(1, np.float32), np.zeros(1, np.int32)
    half = np.float32(0.5)
    iou, track_det, _ = associate(f, ti, 0, xyxy, scores, classes, True, half, half, half)
    cost, high = first_stage_costs(iou, scores, half, half)
    none = np.zeros(0, np.intp)
    _, cost, low, candidates = second_stage_costs(
        iou, cost, none, none, high, scores, ti, half, half
    )
    take_second_stage(track_det, cost, none, none, low, candidates)
    apply(f, ti, 0, track_det, xyxy, scores, classes, half, half, 1, 1, half, 1)
    ids = np.ones(1, np.int32)
    tests, points = zone_tests(
        xyxy,
        classes,
        ids,
        np.zeros(1, np.int8),
        np.zeros(1, np.int8),
        np.asarray([[[0, 0], [5, 0], [5, 5]]], np.float64),
        np.full(1, 3, np.int64),
        np.zeros((1, 1), np.bool_),
        np.zeros(1, np.bool_),
    )
    ended, size = np.ones(1, np.int64), np.zeros(1, np.int64)
    rows, times = np.zeros(2, np.int64), np.zeros(2, np.float64)
    polygon_step(tests, 0, ids, classes, ended, 0.0, rows, rows.copy(), times, times.copy(), size)
    size[0] = 0
    ends = np.asarray([[0, 0], [5, 5]], np.float64)
    line_step(
        tests,
        0,
        ids,
        classes,
        points[0],
        ends,
        ended,
        rows,
        np.zeros(2, np.int8),
        np.zeros((2, 2)),
        size,
    )
