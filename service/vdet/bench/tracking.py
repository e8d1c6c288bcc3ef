"""`vdet bench tracking`: what tracking costs per frame, beside what detection costs, one run.

Scenes are synthetic trajectories (objects moving at constant velocity with box noise, missed
detections and one-frame false positives), so every tracker sees the same detections and
nothing else is measured. Timed per frame, single thread:
- vdet's ByteTrack (vdet.tracking.bytetrack) alone, at each object count;
- a stream's whole tracking step (`StreamTracking.update`: tracker, two polygons, a line);
- the same two with the NumPy implementations they replaced (vdet.bench.tracking_reference), the
  baseline measured in the same run;
- Roboflow's `trackers` ByteTrack, the well-kept implementation the issue named, when it is
  installed (it needs opencv-python, which clashes with the opencv-python-headless vdet
  ships, so vdet does not depend on it);
- the detector on the sample clip (decode excluded), batch 1, the per-frame cost tracking
  is added to.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from vdet.bench.environment import environment
from vdet.bench.stats import summarize_ms
from vdet.bench.tracking_reference import ReferenceByteTracker, ReferenceZoneMonitor
from vdet.config.tracking import TrackingSpec, ZoneSpec
from vdet.core.types import Detections, TrackingSummary
from vdet.tracking.bytetrack import ByteTracker, TrackerParams
from vdet.tracking.stream_tracking import StreamTracking, TrackedFrame
from vdet.tracking.zones import Zone, resolve_zones

FRAME_WH = (1920, 1080)


def synthetic_detections(
    objects: int, frames: int, seed: int = 0, miss_rate: float = 0.05, noise_px: float = 2.0
) -> list[Detections]:
    """Detections of `objects` boxes bouncing around a 1080p frame, with noise and misses."""
    rng = np.random.default_rng(seed)
    w, h = FRAME_WH
    size = rng.uniform(30, 160, size=(objects, 2))
    pos = rng.uniform([0, 0], [w, h], size=(objects, 2))
    vel = rng.uniform(-8, 8, size=(objects, 2))
    classes = rng.integers(0, 6, objects).astype(np.int32)
    out = []
    for _ in range(frames):
        pos += vel
        bounce = (pos < 0) | (pos > [w, h])
        vel[bounce] *= -1
        pos = np.clip(pos, 0, [w, h])
        xyxy = np.concatenate([pos - size / 2, pos + size / 2], axis=1)
        xyxy += rng.normal(0, noise_px, xyxy.shape)
        scores = rng.uniform(0.3, 0.95, objects)
        keep = rng.random(objects) >= miss_rate
        boxes, sc, cl = xyxy[keep], scores[keep], classes[keep]
        if rng.random() < 0.2:  # a false positive somewhere
            fp = rng.uniform([0, 0], [w, h])
            boxes = np.vstack([boxes, [*fp, *(fp + 40)]])
            sc, cl = np.append(sc, 0.65), np.append(cl, 0)
        order = np.argsort(-sc)
        out.append(
            Detections(
                boxes[order].astype(np.float32),
                sc[order].astype(np.float32),
                cl[order].astype(np.int32),
            )
        )
    return out


def _time(step: Callable[[Detections], object], frames: Sequence[Detections], warmup: int) -> Any:
    """Wall-clock milliseconds per frame, and the mean CPU time of this thread (on a shared
    machine, wall time also counts the time other processes had the core)."""
    times = []
    cpu_start = 0.0
    for i, dets in enumerate(frames):
        if i == warmup:
            cpu_start = time.thread_time()
        start = time.perf_counter()
        step(dets)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    cpu_ms = (time.thread_time() - cpu_start) / max(len(times), 1) * 1e3
    return {**summarize_ms(times), "cpu_mean": round(cpu_ms, 4)}


def numpy_call_us(repeats: int = 20000) -> float:
    """CPU microseconds of one small NumPy call here: the unit a vectorised tracker's cost is
    made of (a few dozen calls per frame), to compare machines."""
    a = np.zeros((30, 40), np.float32)
    start = time.thread_time()
    for _ in range(repeats):
        np.add(a, 1.0)
    return round((time.thread_time() - start) / repeats * 1e6, 3)


def _roboflow_step() -> Callable[[Detections], object] | None:
    if importlib.util.find_spec("trackers") is None:
        return None
    import supervision as sv
    from trackers import ByteTrackTracker

    tracker = ByteTrackTracker()

    def step(dets: Detections) -> object:
        return tracker.update(
            sv.Detections(xyxy=dets.xyxy, confidence=dets.scores, class_id=dets.class_ids)
        )

    return step


# What a stream's tracking step is measured with: two polygons (one counting some classes by
# the boxes' bottom centre) and a counting line.
BENCH_ZONES = (
    ZoneSpec(id="pen", kind="polygon", points=[(0.1, 0.1), (0.5, 0.1), (0.5, 0.9), (0.1, 0.9)]),
    ZoneSpec(
        id="dock",
        kind="polygon",
        points=[(0.55, 0.5), (0.95, 0.5), (0.95, 0.95), (0.75, 0.7), (0.55, 0.95)],
        classes=[0, 1, 2],
        anchor="bottom_center",
    ),
    ZoneSpec(id="gate", kind="line", points=[(0.7, 0.0), (0.7, 1.0)]),
)


def _resolved_zones() -> tuple[Zone, ...]:
    return resolve_zones(
        BENCH_ZONES, lambda refs: None if refs is None else frozenset(map(int, refs))
    )


def _stream_step() -> Callable[[Detections], object]:
    resolved = _resolved_zones()
    tracking, params = StreamTracking(), TrackerParams.of(TrackingSpec())
    clock = iter(range(1 << 30))

    def step(dets: Detections) -> object:
        return tracking.update(dets, FRAME_WH, next(clock) / 30, params, resolved)

    return step


def _reference_stream_step() -> Callable[[Detections], object]:
    """`StreamTracking.update`'s steps with the NumPy tracker and zone monitor."""
    tracker, monitor = (
        ReferenceByteTracker(TrackerParams.of(TrackingSpec())),
        ReferenceZoneMonitor(),
    )
    monitor.set_zones(_resolved_zones())
    clock = iter(range(1 << 30))

    def step(dets: Detections) -> object:
        update = tracker.update(dets)
        tracked = replace(dets, tracker_id=update.tracker_id)
        events, occupancy = monitor.update(tracked, FRAME_WH, next(clock) / 30, update.ended_ids)
        summary = TrackingSummary(tracks_started=update.started_classes, occupancy=occupancy)
        return TrackedFrame(tracked, events, summary)

    return step


def run_tracking_bench(
    model: str,
    backend: str,
    source: str,
    object_counts: Sequence[int] = (10, 30, 100),
    frames: int = 1000,
    detector_frames: int = 30,
    warmup: int = 20,
) -> dict[str, object]:
    """Per-frame milliseconds of each tracker at each object count, and of detection."""
    from vdet.bench.pipeline import run_pipeline_bench

    runs = []
    for n in object_counts:
        scene = synthetic_detections(n, frames + warmup, seed=n)
        row: dict[str, object] = {
            "objects": n,
            "vdet_bytetrack_ms": _time(ByteTracker().update, scene, warmup),
            "vdet_stream_tracking_ms": _time(_stream_step(), scene, warmup),
            "numpy_reference_bytetrack_ms": _time(ReferenceByteTracker().update, scene, warmup),
            "numpy_reference_stream_tracking_ms": _time(_reference_stream_step(), scene, warmup),
        }
        roboflow = _roboflow_step()
        if roboflow is not None:
            row["roboflow_trackers_bytetrack_ms"] = _time(roboflow, scene, warmup)
        runs.append(row)
    detection = run_pipeline_bench(
        model=model, backend=backend, source=source, frames=detector_frames, warmup=3
    )
    latency: Any = detection["latency_ms"]
    detect_ms = {
        k: latency[k] for k in ("preprocess", "inference", "postprocess", "total") if k in latency
    }
    at_30 = next((r for r in runs if r["objects"] == 30), None)
    ratios: dict[str, float] = {}
    if at_30 is not None:
        ours: Any = at_30["vdet_stream_tracking_ms"]
        ratios["stream_tracking_over_detection_p50"] = round(
            ours["p50"] / detect_ms["total"]["p50"], 6
        )
        baseline: Any = at_30["numpy_reference_stream_tracking_ms"]
        ratios["numpy_reference_over_vdet_stream_tracking_p50"] = round(
            baseline["p50"] / ours["p50"], 2
        )
        baseline_tracker: Any = at_30["numpy_reference_bytetrack_ms"]
        vdet_tracker: Any = at_30["vdet_bytetrack_ms"]
        ratios["numpy_reference_over_vdet_bytetrack_p50"] = round(
            baseline_tracker["p50"] / vdet_tracker["p50"], 2
        )
        if "roboflow_trackers_bytetrack_ms" in at_30:
            theirs: Any = at_30["roboflow_trackers_bytetrack_ms"]
            tracker_only: Any = at_30["vdet_bytetrack_ms"]
            ratios["roboflow_over_vdet_bytetrack_p50"] = round(
                theirs["p50"] / tracker_only["p50"], 2
            )
    return {
        "scenario": "tracking",
        "environment": environment(),
        "frames_per_run": frames,
        "numpy_call_us": numpy_call_us(),
        "frame_wh": list(FRAME_WH),
        "runs": runs,
        "detection": {
            "backend": detection["backend"],
            "device": detection["device"],
            # the file's name: where it lay on the measuring machine says nothing
            "source": {**detection["source"], "path": Path(source).name},  # type: ignore[dict-item]
            "frames": detection["frames"],
            "latency_ms": detect_ms,
        },
        "ratios": ratios,
        "target": "stream tracking (tracker, two polygons, a line) <= 0.1 ms per frame with "
        "30 objects (p50)",
    }
