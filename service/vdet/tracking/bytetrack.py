"""A ByteTrack multi-object tracker over whole arrays: one `update` per frame, in frame order.

The association is ByteTrack's (Zhang et al., 2022): detections at or above
`track_threshold` are matched first to every live track (seen or lost) by IoU with the track's
predicted box; the weaker detections then get a second chance at the tracks still unmatched
that were seen on the previous frame, which keeps a track through a partial occlusion where
the detector's score drops. Unmatched tracks are kept as lost for `lost_track_buffer` frames
and can be matched again; an unmatched strong detection starts a track, which gets its id once
it has been matched on `min_hits` frames.

Motion is a constant-velocity alpha-beta filter on each box edge (the steady-state Kalman
filter of that model): the same prediction ByteTrack's Kalman filter makes for boxes moving
steadily, for a few array operations per frame instead of per-track 8x8 matrix algebra, which
is what keeps 30 tracks under 100 us (bench/results, `vdet bench tracking`). The optimal
assignment is SciPy's `linear_sum_assignment`.

This module owns the track table and the ids of one stream. It knows nothing about zones,
streams or threads: the caller serialises calls.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.optimize import linear_sum_assignment

from vdet.types import NO_TRACK, Detections, FloatArray, IntArray

# Gains of the alpha-beta filter: how far a matched track's box moves toward the detection
# (alpha) and how much of the residual goes into its velocity (beta). High alpha: the boxes
# served are the detector's, the filter only has to predict through short gaps.
_ALPHA = np.float32(0.85)
_BETA = np.float32(0.3)
_BIG_COST = 1e6


@dataclass(frozen=True)
class TrackerParams:
    """Thresholds of the association (see the module docstring); validated by the config."""

    track_threshold: float = 0.5
    new_track_threshold: float = 0.6
    match_iou: float = 0.2
    low_match_iou: float = 0.5
    lost_track_buffer: int = 30
    min_hits: int = 1
    class_aware: bool = True


@dataclass(frozen=True)
class TrackUpdate:
    """What one frame did to the tracks.

    `tracker_id`: per input detection, its track's id or NO_TRACK; `started_classes`: the
    class of each track confirmed (given an id) on this frame; `ended_ids`: ids of confirmed
    tracks dropped on this frame after `lost_track_buffer` frames unseen.
    """

    tracker_id: IntArray
    started_classes: tuple[int, ...]
    ended_ids: tuple[int, ...]


def box_iou(a: FloatArray, b: FloatArray) -> FloatArray:
    """IoU of every box of `a` (N, 4) with every box of `b` (M, 4): (N, M), xyxy."""
    # Column by column on (N, M) arrays: a third of the operations of broadcasting (N, M, 2)
    # corners, which matters at ~1 us per NumPy call and a few dozen calls per frame.
    ax1, ay1, ax2, ay2 = a[:, 0:1], a[:, 1:2], a[:, 2:3], a[:, 3:4]
    bx1, by1, bx2, by2 = b[:, 0], b[:, 1], b[:, 2], b[:, 3]
    iw = np.minimum(ax2, bx2) - np.maximum(ax1, bx1)
    ih = np.minimum(ay2, by2) - np.maximum(ay1, by1)
    np.maximum(iw, 0, out=iw)
    np.maximum(ih, 0, out=ih)
    inter = iw * ih
    union = (ax2 - ax1) * (ay2 - ay1) + ((bx2 - bx1) * (by2 - by1) - inter)
    iou: FloatArray = (inter / np.maximum(union, np.float32(1e-9))).astype(np.float32, copy=False)
    return iou


def _match(iou: FloatArray, min_iou: float) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """Rows and columns of the assignment maximising total IoU, pairs under min_iou dropped."""
    if iou.size == 0:
        empty = np.zeros(0, np.intp)
        return empty, empty
    cost = np.where(iou >= min_iou, 1.0 - iou, _BIG_COST)
    rows, cols = linear_sum_assignment(cost)
    ok = cost[rows, cols] < _BIG_COST
    return rows[ok], cols[ok]


class ByteTracker:
    """Tracks of one stream. Feed every frame's detections to `update`, in order."""

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
