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
steadily, for a few multiply-adds per track instead of per-track 8x8 matrix algebra.

Cost: the tracks are one struct-of-arrays table, and a frame is two compiled passes over it
(vdet.tracking.compiled): predict + IoU + the matches when they are unambiguous, then the
filter update, ends and starts. Most frames are unambiguous (each detection overlaps at most
one track enough to match and the other way round); there both of ByteTrack's optimal
assignments are exactly those pairs. Where a detection could continue two tracks (objects
crossing), SciPy's `linear_sum_assignment` runs both stages as before, so the result is the
optimal assignment on every frame, never a greedy approximation.

This module owns the track table and the ids of one stream. It knows nothing about zones,
streams or threads: the caller serialises calls.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.optimize import linear_sum_assignment

from vdet.config.tracking import TrackingSpec
from vdet.core.types import Detections, FloatArray, IntArray
from vdet.tracking import compiled

# Gains of the alpha-beta filter: how far a matched track's box moves toward the detection
# (alpha) and how much of the residual goes into its velocity (beta). High alpha: the boxes
# served are the detector's, the filter only has to predict through short gaps.
_ALPHA = np.float32(0.85)
_BETA = np.float32(0.3)


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

    @classmethod
    def of(cls, spec: TrackingSpec) -> TrackerParams:
        """A stream's tracker settings (`StreamSpec.tracking`) as the tracker takes them."""
        return cls(
            track_threshold=spec.track_threshold,
            new_track_threshold=spec.new_track_threshold,
            match_iou=spec.match_iou,
            lost_track_buffer=spec.lost_track_buffer,
            min_hits=spec.min_hits,
            class_aware=spec.class_aware,
        )


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


_NONE = np.zeros(0, np.intp)


class ByteTracker:
    """Tracks of one stream. Feed every frame's detections to `update`, in order."""

    # The track table: one float and one int array, a row per track (struct of arrays, no
    # per-track objects), with spare rows so that a frame's new tracks are appended in place.
    # Float columns: the filter's box (xyxy) and per-frame velocity; int columns: class, id
    # (NO_TRACK until confirmed), frames matched, frames since last matched (0: seen on the
    # previous frame); see vdet.tracking.compiled.
    _INITIAL_ROWS = 64

    def __init__(self, params: TrackerParams | None = None) -> None:
        self.params = params or TrackerParams()
        self._next_id = 1
        self._live = 0
        self._f = np.zeros((self._INITIAL_ROWS, 8), np.float32)
        self._i = np.zeros((self._INITIAL_ROWS, 4), np.int32)

    def __len__(self) -> int:
        """Live tracks, lost ones and not yet confirmed ones included."""
        return self._live

    def update(self, detections: Detections) -> TrackUpdate:
        p = self.params
        # The compiled functions are built for these types (`compiled.warm_up`); another
        # dtype or layout would compile a second version on the stream's thread.
        xyxy = np.ascontiguousarray(detections.xyxy, np.float32)
        scores = np.ascontiguousarray(detections.scores, np.float32)
        classes = np.ascontiguousarray(detections.class_ids, np.int32)
        t, n = self._live, len(scores)
        if len(self._f) < t + n:  # room for every detection to start a track
            rows = max(2 * len(self._f), t + n)
            self._f = np.concatenate([self._f, np.zeros((rows - len(self._f), 8), np.float32)])
            self._i = np.concatenate([self._i, np.zeros((rows - len(self._i), 4), np.int32)])
        iou, track_det, unique = compiled.associate(
            self._f,
            self._i,
            t,
            xyxy,
            scores,
            classes,
            p.class_aware,
            np.float32(p.track_threshold),
            np.float32(p.match_iou),
            np.float32(p.low_match_iou),
        )
        if not unique:
            track_det = self._assign(iou, scores)
        tracker_id, started, ended, self._live, self._next_id = compiled.apply(
            self._f,
            self._i,
            t,
            track_det,
            xyxy,
            scores,
            classes,
            _ALPHA,
            _BETA,
            p.min_hits,
            p.lost_track_buffer,
            np.float32(max(p.new_track_threshold, p.track_threshold)),
            self._next_id,
        )
        return TrackUpdate(tracker_id, tuple(started.tolist()), tuple(ended.tolist()))

    def _assign(self, iou: FloatArray, scores: FloatArray) -> npt.NDArray[np.intp]:
        """ByteTrack's two optimal assignments, for frames where some detection could continue
        more than one track or the other way round: the detection each track gets, or -1.
        The cost matrices are posed and read by compiled code; SciPy solves them."""
        p = self.params
        track_threshold = np.float32(p.track_threshold)
        cost, high = compiled.first_stage_costs(
            iou, scores, track_threshold, np.float32(p.match_iou)
        )
        rows, cols = linear_sum_assignment(cost) if cost.size else (_NONE, _NONE)
        track_det: npt.NDArray[np.intp]
        track_det, cost, low, candidates = compiled.second_stage_costs(
            iou,
            cost,
            rows,
            cols,
            high,
            scores,
            self._i,
            track_threshold,
            np.float32(p.low_match_iou),
        )
        if cost.size:
            rows, cols = linear_sum_assignment(cost)
            compiled.take_second_stage(track_det, cost, rows, cols, low, candidates)
        return track_det
