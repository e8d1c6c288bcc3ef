"""`vdet bench serve --memory-every`: each process's memory over the window and its slope, on a
real `vdet serve` (ONNX Runtime on the CPU; no GPU columns here)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.videos import write_h264_clip

from vdet.bench.serve.memory_trend import slope_per_minute
from vdet.bench.serve.results import ServeBenchResult
from vdet.cli.main import main


def test_the_slope_is_least_squares_per_minute() -> None:
    assert slope_per_minute([(0.0, 100.0), (30.0, 101.0), (60.0, 102.0)]) == pytest.approx(2.0)
    assert slope_per_minute([(0.0, 5.0), (60.0, 5.0)]) == 0.0
    assert slope_per_minute([(0.0, 5.0)]) is None
    assert slope_per_minute([(1.0, 5.0), (1.0, 6.0)]) is None


@pytest.mark.slow
def test_every_process_of_the_run_is_sampled_by_role(tmp_path: Path) -> None:
    clip = write_h264_clip(tmp_path / "clip.mp4", seconds=2.0, size_wh=(320, 180))
    out = tmp_path / "memory.json"
    argv = ["bench", "serve", "--streams", "1", "--duration", "3", "--memory-every", "0.5"]
    argv += ["--warmup-seconds", "0.5", "--clip", str(clip), "--backend", "onnxruntime"]
    argv += ["--clients", "2", "--output", str(out), "--control-interval", "0.2"]
    assert main(argv) == 0
    (step,) = ServeBenchResult.model_validate_json(out.read_text()).variants[0].steps
    assert step.memory_trend is not None
    by_role = {t.role: t for t in step.memory_trend}
    assert {"api", "client 0", "client 1", "bench"} <= set(by_role)
    api = by_role["api"]
    assert api.samples >= 4 and api.rss_end_mib > 50 and api.rss_slope_mib_per_min is not None
    assert api.rss_late_slope_mib_per_min is not None
    assert api.gpu_start_mib is None  # no GPU here
