"""`vdet bench tracking` end to end on small numbers: the tiny model, a real H.264 clip."""

from __future__ import annotations

from pathlib import Path

from support.apptest import CLIP_WH, write_tiny_model
from support.videos import write_h264_clip

from vdet.bench.tracking import run_tracking_bench, synthetic_detections


def test_synthetic_detections_are_valid_and_reproducible() -> None:
    a, b = synthetic_detections(30, 5, seed=1), synthetic_detections(30, 5, seed=1)
    assert len(a) == 5 and all(len(d) >= 20 for d in a)
    assert all((x.xyxy == y.xyxy).all() for x, y in zip(a, b, strict=True))
    assert all((d.scores[:-1] >= d.scores[1:]).all() for d in a)  # best first, as detected


def test_bench_reports_trackers_beside_detection(tmp_path: Path) -> None:
    model = write_tiny_model(tmp_path / "tiny.onnx")
    clip = write_h264_clip(tmp_path / "clip.mp4", seconds=0.3, fps=30, size_wh=CLIP_WH)
    result = run_tracking_bench(
        str(model), "onnxruntime", str(clip), object_counts=(5,), frames=20, detector_frames=3
    )
    (run,) = result["runs"]  # type: ignore[misc]
    assert run["objects"] == 5
    assert run["vdet_bytetrack_ms"]["n"] == 20 and run["vdet_bytetrack_ms"]["cpu_mean"] > 0
    assert run["vdet_stream_tracking_ms"]["p50"] > 0
    assert result["detection"]["latency_ms"]["total"]["n"] == 3  # type: ignore[index]
    assert result["environment"]["date"]  # type: ignore[index]
    assert result["numpy_call_us"] > 0  # type: ignore[operator]
