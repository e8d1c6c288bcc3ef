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
    tl = np.maximum(a[:, None, :2], b[None, :, :2])
    br = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(br - tl, 0, None).prod(axis=2)
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    union = area_a[:, None] + area_b[None, :] - inter
    iou: FloatArray = np.where(union > 0, inter / np.maximum(union, 1e-9), 0).astype(np.float32)
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

    def __init__(self, params: TrackerParams | None = None) -> None:
        self.params = params or TrackerParams()
        self._next_id = 1
        self._box = np.zeros((0, 4), np.float32)  # the filter's box, predicted on update
        self._vel = np.zeros((0, 4), np.float32)  # per-frame velocity of each edge
        self._cls = np.zeros(0, np.int32)
        self._id = np.zeros(0, np.int32)  # NO_TRACK until confirmed
        self._hits = np.zeros(0, np.int32)  # frames matched
        self._lost = np.zeros(0, np.int32)  # frames since last matched (0: seen last frame)

    def __len__(self) -> int:
        """Live tracks, lost ones and not yet confirmed ones included."""
        return len(self._id)

    def update(self, detections: Detections) -> TrackUpdate:
        p = self.params
        n = len(detections)
        tracker_id = np.full(n, NO_TRACK, np.int32)
        self._box += self._vel  # predict every track one frame ahead
        scores, classes = detections.scores, detections.class_ids
        det_box = detections.xyxy.astype(np.float32, copy=False)

        high = np.flatnonzero(scores >= p.track_threshold)
        low = np.flatnonzero(scores < p.track_threshold)
        track_det = np.full(len(self._id), -1, np.intp)  # the detection each track got

        # 1. strong detections against every track, seen or lost
        iou = self._iou(det_box[high], classes[high], np.arange(len(self._id)))
        rows, cols = _match(iou, p.match_iou)
        track_det[cols] = high[rows]
        unmatched_high = np.setdiff1d(high, high[rows], assume_unique=True)

        # 2. weak detections against the tracks seen on the previous frame and still unmatched
        if len(low):
            candidates = np.flatnonzero((track_det < 0) & (self._lost == 0))
            iou = self._iou(det_box[low], classes[low], candidates)
            rows, cols = _match(iou, p.low_match_iou)
            track_det[candidates[cols]] = low[rows]

        matched = np.flatnonzero(track_det >= 0)
        dets = track_det[matched]
        residual = det_box[dets] - self._box[matched]
        self._box[matched] += _ALPHA * residual
        self._vel[matched] += _BETA * residual
        self._cls[matched] = classes[dets]
        self._hits[matched] += 1
        self._lost[matched] = 0
        unmatched = track_det < 0
        self._lost[unmatched] += 1
        self._vel[unmatched & (self._lost > 1)] *= np.float32(0.9)  # lost: slow down, drift less

        # confirm tracks that reached min_hits; unconfirmed ones die when they miss a frame
        confirm = (self._id == NO_TRACK) & (self._hits >= p.min_hits) & ~unmatched
        started = self._assign_ids(confirm)
        tracker_id[dets] = self._id[matched]
        expired = (self._lost > p.lost_track_buffer) | (unmatched & (self._id == NO_TRACK))
        ended = tuple(int(i) for i in self._id[expired & (self._id != NO_TRACK)])
        if expired.any():
            self._keep(~expired)

        # 3. new tracks from strong detections nobody claimed
        fresh = unmatched_high[scores[unmatched_high] >= p.new_track_threshold]
        if len(fresh):
            k = len(fresh)
            self._box = np.concatenate([self._box, det_box[fresh]])
            self._vel = np.concatenate([self._vel, np.zeros((k, 4), np.float32)])
            self._cls = np.concatenate([self._cls, classes[fresh].astype(np.int32)])
            self._id = np.concatenate([self._id, np.full(k, NO_TRACK, np.int32)])
            self._hits = np.concatenate([self._hits, np.ones(k, np.int32)])
            self._lost = np.concatenate([self._lost, np.zeros(k, np.int32)])
            new = np.zeros(len(self._id), np.bool_)
            new[-k:] = self._hits[-k:] >= p.min_hits
            started += self._assign_ids(new)
            tracker_id[fresh] = self._id[-k:]
        return TrackUpdate(tracker_id, started, ended)

    def _iou(
        self, boxes: FloatArray, classes: IntArray, tracks: npt.NDArray[np.intp]
    ) -> FloatArray:
        iou = box_iou(boxes, self._box[tracks])
        if self.params.class_aware and iou.size:
            iou[classes[:, None] != self._cls[tracks][None, :]] = 0.0
        return iou

    def _assign_ids(self, rows: npt.NDArray[np.bool_]) -> tuple[int, ...]:
        count = int(rows.sum())
        if not count:
            return ()
        self._id[rows] = np.arange(self._next_id, self._next_id + count, dtype=np.int32)
        self._next_id += count
        return tuple(int(c) for c in self._cls[rows])

    def _keep(self, rows: npt.NDArray[np.bool_]) -> None:
        self._box, self._vel = self._box[rows], self._vel[rows]
        self._cls, self._id = self._cls[rows], self._id[rows]
        self._hits, self._lost = self._hits[rows], self._lost[rows]
