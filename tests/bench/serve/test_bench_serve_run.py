"""`vdet bench serve` end to end: a real `vdet serve` (the installed entry point, ONNX Runtime on
the CPU) with one paced stream of a small clip, a real WebSocket client, the result file
checked against its schema, then rendered by the lab's bench/report.py. A second variant names a
setting this server does not have: it must fail on its own, with the server's reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.lab import load_script
from support.videos import write_h264_clip

from vdet.bench.serve.results import ServeBenchResult
from vdet.cli.main import main

pytestmark = pytest.mark.slow


def test_one_stream_through_a_real_server_and_its_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clip = write_h264_clip(tmp_path / "clip.mp4", seconds=2.0, size_wh=(320, 180))
    out = tmp_path / "serve.json"
    argv = ["bench", "serve", "--streams", "1", "--duration", "2", "--warmup-seconds", "0.5"]
    argv += ["--clip", str(clip), "--backend", "onnxruntime", "--output", str(out)]
    argv += ["--variant", "one-process:", "--variant", "future:workers.per_gpu=8"]
    argv += ["--control-interval", "0.1"]
    assert main(argv) == 0

    result = ServeBenchResult.model_validate_json(out.read_text())
    assert result.options.streams == [1] and result.options.clip.width == 320
    assert result.machine.cpu_count and result.date

    ok, future = result.variants
    assert ok.error is None and ok.ready_seconds is not None
    assert ok.exit is not None and ok.exit.signal_sent == "SIGTERM" and ok.exit.orphans == []
    (step,) = ok.steps
    assert step.added == 1 and step.error is None and step.all_publishing
    (client,) = step.clients
    assert client.results > 0 and client.latency_ms is not None and client.latency_ms.p50 > 0
    assert client.missed_seq_gaps == 0 and client.closes == []
    assert step.control.get_detections_ms is not None
    assert step.server is not None and step.server.cpu_percent > 0
    assert step.counters is not None and step.counters.decoded > 0
    assert step.gpu is None  # no GPU here
    assert step.decode_paths == {"cpu": 1}
    assert not step.bench_client.client_bound
    assert step.api_stalls is not None and step.api_stalls.loop_lag_samples > 0

    assert future.steps == [] and future.environment == {"VDET_WORKERS__PER_GPU": "8"}
    assert future.exit is not None and future.exit.exit_code == 2
    assert future.error is not None and "workers.per_gpu: unknown key" in future.error

    capsys.readouterr()
    assert load_script("report.py").main([str(out), "--out-dir", str(tmp_path / "report")]) == 0
    written = json.loads(capsys.readouterr().out)["written"]
    markdown = (tmp_path / "report" / "serve.md").read_text()
    assert "| one-process | 1 |" in markdown and "VDET_WORKERS__PER_GPU=8" in markdown
    assert any(p.endswith("serve-streams_scaling.png") for p in written)


def test_unpaced_streams_go_as_fast_as_detected_beside_ultralytics_before_and_after(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--unpaced: the stream analyses the clip frame by frame (none dropped, no rate to
    expect, no extra stream added by the control calls); --baseline ultralytics brackets the
    server with Ultralytics' predict on the same clip, and the report gives the ratio."""
    pytest.importorskip("ultralytics")
    clip = write_h264_clip(tmp_path / "clip.mp4", seconds=2.0, size_wh=(320, 180))
    out = tmp_path / "serve.json"
    argv = ["bench", "serve", "--streams", "1", "--duration", "2", "--warmup-seconds", "0.5"]
    argv += ["--clip", str(clip), "--backend", "onnxruntime", "--output", str(out)]
    argv += ["--unpaced", "--baseline", "ultralytics", "--frames", "4", "--control-interval", "0.1"]
    assert main(argv) == 0

    result = ServeBenchResult.model_validate_json(out.read_text())
    assert result.options.unpaced
    ((step,),) = [v.steps for v in result.variants]
    assert step.error is None and step.expected_results_per_s is None and not step.real_time
    assert step.counters is not None and step.counters.dropped == 0
    assert step.results_per_s is not None and step.results_per_s > 0
    assert step.control.post_ms is None and step.control.delete_ms is None  # GETs only
    assert [u.when for u in result.ultralytics_baselines] == ["before", "after"]
    for baseline in result.ultralytics_baselines:
        assert baseline.error is None and baseline.frames == 4
        assert baseline.ultralytics_fps is not None and baseline.ultralytics_fps > 0
        assert baseline.boxes_matched is not None and baseline.boxes_matched >= 0.99

    capsys.readouterr()
    assert load_script("report.py").main([str(out), "--out-dir", str(tmp_path / "report")]) == 0
    markdown = (tmp_path / "report" / "serve.md").read_text()
    assert "Ultralytics predict before the variants" in markdown
    assert "results/s over Ultralytics' frames/s" in markdown
