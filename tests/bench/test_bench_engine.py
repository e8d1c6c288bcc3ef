"""`vdet bench engine`: the backend alone per batch size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.apptest import write_tiny_model

from vdet.bench.engine import run_engine_bench
from vdet.cli.main import main


def test_engine_bench_times_every_batch_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = write_tiny_model(tmp_path / "tiny.onnx")  # fixed batch 1: larger ones are split
    out = tmp_path / "engine.json"
    args = ["bench", "engine", "--model", str(model), "--backend", "onnxruntime"]
    assert main([*args, "--batches", "1,3", "--iterations", "2", "--output", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["scenario"] == "engine" and result["backend"] == "onnxruntime"
    assert [r["batch"] for r in result["runs"]] == [1, 3]
    for run in result["runs"]:
        assert run["latency_ms"]["n"] == 2 and run["images_per_s"] > 0
    assert "2/2 done" in capsys.readouterr().err  # the progress bar ends complete


def test_engine_bench_refuses_bad_batch_sizes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", "engine", "--batches", "1,two"]) == 2
    assert "--batches must be integers" in capsys.readouterr().err
    with pytest.raises(ValueError, match="positive"):
        run_engine_bench(write_tiny_model(tmp_path / "t.onnx"), "onnxruntime", [0])
