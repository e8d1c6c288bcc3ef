"""`vdet eval --track`: tracking accuracy (IDF1, MOTA) on synthetic clips with exact identities,
and zone / line counts on a clip made for counting, against the generator's answer.

Scoring is py-motmetrics' (CLEAR MOT and identity metrics, as in the MOTChallenge devkit);
this module only runs the detector and the service's own per-stream tracking
(`StreamTracking`, as the stream manager calls it) over rendered frames and packs the figures.
As in MOTChallenge, truth objects a detector cannot be expected to see (mostly hidden behind
another, or tiny) are "don't care": neither a miss when absent nor a false positive when found.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from vdet.config.tracking import TrackingSpec, ZoneSpec
from vdet.core.types import NO_TRACK, Detections, FloatArray, ImageArray
from vdet.inference.detector import Detector
from vdet.modelkit.dataset.synthetic import VideoFrameTruth, iter_video
from vdet.tracking.bytetrack import TrackerParams, box_iou
from vdet.tracking.stream_tracking import StreamTracking, TrackedFrame
from vdet.tracking.zones import resolve_zones

MATCH_IOU = 0.5  # a track box matches a truth box at IoU >= 0.5 (MOTChallenge)
MIN_SIZE = 24  # truth objects smaller than this (px) or ...
MIN_VISIBLE = 0.5  # ... less visible than this are "don't care"


@dataclass(frozen=True)
class ClipScore:
    seed: int
    frames: int
    objects: int
    idf1: float
    mota: float
    motp_iou: float
    id_switches: int
    false_positives: int
    misses: int


@dataclass(frozen=True)
class CountScore:
    seed: int
    frames: int
    crossings_expected: dict[str, int]
    crossings_found: dict[str, int]
    entries_expected: dict[str, int]
    entries_found: dict[str, int]

    @property
    def exact(self) -> bool:
        return (
            self.crossings_expected == self.crossings_found
            and self.entries_expected == self.entries_found
        )


@dataclass(frozen=True)
class TrackingReport:
    model: str
    backend: str
    device: str
    tracking: dict[str, object]
    idf1: float
    mota: float
    clips: list[ClipScore]
    counting: CountScore | None
    counts_exact: bool | None
    tracking_us_per_frame: float
    detection_ms_per_frame: float
    seconds: float
    extra: dict[str, object] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "counts_exact": self.counts_exact}, indent=2)


def _truth_arrays(frame: VideoFrameTruth) -> tuple[list[int], FloatArray, np.ndarray]:
    ids = [a.track_id if a.track_id is not None else -1 for a in frame.annotations]
    boxes = np.asarray([a.xyxy for a in frame.annotations], np.float32).reshape(-1, 4)
    cares = np.asarray(
        [a.size >= MIN_SIZE and a.visible_fraction >= MIN_VISIBLE for a in frame.annotations],
        np.bool_,
    )
    return ids, boxes, cares


def _accumulate(acc: Any, frame: VideoFrameTruth, tracked: Detections) -> None:

    ids, boxes, cares = _truth_arrays(frame)
    tid = tracked.tracker_id
    keep = np.ones(len(tracked), np.bool_) if tid is None else tid != NO_TRACK
    hyp_boxes, hyp_ids = tracked.xyxy[keep], [] if tid is None else tid[keep].tolist()
    # A track on a "don't care" object is dropped, not counted as a false positive.
    if len(hyp_boxes) and (~cares).any():
        on_ignored = (box_iou(hyp_boxes, boxes[~cares]) >= MATCH_IOU).any(axis=1)
        on_cared = (box_iou(hyp_boxes, boxes[cares]) >= MATCH_IOU).any(axis=1)
        drop = np.asarray(on_ignored & ~on_cared, np.bool_)
        hyp_ids = [i for i, d in zip(hyp_ids, drop.tolist(), strict=True) if not d]
        hyp_boxes = hyp_boxes[~drop]
    gt_boxes = boxes[cares]
    gt_ids = [i for i, c in zip(ids, cares.tolist(), strict=True) if c]
    # 1 - IoU, NaN where no match is allowed: what mm.distances.iou_matrix computes (it
    # calls np.asfarray, gone from NumPy 2).
    distances = 1.0 - box_iou(gt_boxes, hyp_boxes).astype(np.float64)
    distances[distances > 1.0 - MATCH_IOU] = np.nan
    acc.update(gt_ids, hyp_ids, distances)


def _track_clip(
    detector: Detector,
    clip: Iterable[tuple[ImageArray, VideoFrameTruth]],
    spec: TrackingSpec,
    zones: Sequence[ZoneSpec],
    fps: float,
    timing: dict[str, list[float]],
) -> Iterator[tuple[VideoFrameTruth, TrackedFrame]]:
    """Detect and track every frame, as a stream's pipeline thread does."""
    tracking = StreamTracking()
    names = detector.info.names
    resolved = resolve_zones(
        zones, lambda refs: None if refs is None else frozenset(names.index(str(r)) for r in refs)
    )
    params = TrackerParams.of(spec)
    for i, (image, truth) in enumerate(clip):
        ((dets, timings),) = detector.detect([image])
        timing["detect"].append(timings.preprocess + timings.inference + timings.postprocess)
        started = time.perf_counter()
        size_wh = (image.shape[1], image.shape[0])
        tracked = tracking.update(dets, size_wh, i / fps, params, resolved)
        timing["track"].append(time.perf_counter() - started)
        yield truth, tracked


def evaluate_tracking(
    detector: Detector,
    seeds: Sequence[int],
    seconds: float = 8.0,
    fps: int = 30,
    counting_seed: int | None = 0,
    spec: TrackingSpec | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> TrackingReport:
    """IDF1 / MOTA over one synthetic clip per seed, and exact counts on a counting clip."""
    import motmetrics as mm

    from vdet.modelkit.dataset.counting import counting_zones, expected_counts, iter_counting_video

    spec = spec or TrackingSpec()
    start = time.perf_counter()
    timing: dict[str, list[float]] = {"detect": [], "track": []}
    accumulators, scores = [], []
    total = len(seeds) + (counting_seed is not None)
    for k, seed in enumerate(seeds):
        acc = mm.MOTAccumulator(auto_id=True)
        truth = []
        clip = iter_video(seed, round(seconds * fps), fps=fps)
        for frame_truth, frame in _track_clip(detector, clip, spec, (), fps, timing):
            _accumulate(acc, frame_truth, frame.detections)
            truth.append(frame_truth)
        accumulators.append(acc)
        summary = mm.metrics.create().compute(
            acc,
            metrics=["idf1", "mota", "motp", "num_switches", "num_false_positives", "num_misses"],
        )
        row = summary.iloc[0]
        scores.append(
            ClipScore(
                seed=seed,
                frames=len(truth),
                objects=len({a.track_id for t in truth for a in t.annotations}),
                idf1=round(float(row["idf1"]), 4),
                mota=round(float(row["mota"]), 4),
                motp_iou=round(1.0 - float(row["motp"]), 4),
                id_switches=int(row["num_switches"]),
                false_positives=int(row["num_false_positives"]),
                misses=int(row["num_misses"]),
            )
        )
        if progress:
            progress(k + 1, total)
    overall = (
        mm.metrics.create()
        .compute_many(accumulators, metrics=["idf1", "mota"], generate_overall=True)
        .loc["OVERALL"]
    )

    counting = None
    if counting_seed is not None:
        zones = [ZoneSpec.model_validate(z) for z in counting_zones()]
        frames = iter_counting_video(counting_seed, num_frames=round(6 * fps), fps=fps)
        names = detector.info.names
        crossings: Counter[str] = Counter()
        entries: Counter[str] = Counter()
        truth = []
        for frame_truth, frame in _track_clip(detector, frames, spec, zones, fps, timing):
            truth.append(frame_truth)
            for e in frame.events:
                if e.type == "line_cross":
                    crossings[f"{e.zone}/{names[e.class_id]}/{e.direction}"] += 1
                elif e.type == "zone_enter":
                    entries[f"{e.zone}/{names[e.class_id]}"] += 1
        expected_crossings, expected_entries = expected_counts(truth)
        counting = CountScore(
            seed=counting_seed,
            frames=len(truth),
            crossings_expected={"/".join(k): v for k, v in sorted(expected_crossings.items())},
            crossings_found=dict(sorted(crossings.items())),
            entries_expected={"/".join(k): v for k, v in sorted(expected_entries.items())},
            entries_found=dict(sorted(entries.items())),
        )
        if progress:
            progress(total, total)
    return TrackingReport(
        model=f"{detector.info.path.name}@{detector.info.sha256[:12]}",
        backend=detector.backend.name,
        device=detector.backend.device,
        tracking=spec.model_dump(),
        idf1=round(float(overall["idf1"]), 4),
        mota=round(float(overall["mota"]), 4),
        clips=scores,
        counting=counting,
        counts_exact=None if counting is None else counting.exact,
        tracking_us_per_frame=round(float(np.mean(timing["track"])) * 1e6, 1),
        detection_ms_per_frame=round(float(np.mean(timing["detect"])) * 1e3, 2),
        seconds=round(time.perf_counter() - start, 1),
    )
