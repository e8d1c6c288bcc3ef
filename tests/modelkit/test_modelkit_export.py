"""`vdet export`: Ultralytics model -> raw-head ONNX, checked, and run through ONNX Runtime."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest

from vdet.cli.main import main

pytestmark = [pytest.mark.slow, pytest.mark.train]


@pytest.fixture(autouse=True)
def _offline_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ultralytics")
    monkeypatch.setenv("YOLO_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # Ultralytics writes next to a .yaml model's name


def _export(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Ultralytics' and torch.onnx's own deprecation noise
        rc = main(["export", *args])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize(("model", "dynamic"), [("yolov8n.yaml", False), ("yolov8s.yaml", True)])
def test_export_round_trip(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], model: str, dynamic: bool
) -> None:
    """A checkpoint's ONNX gives the checkpoint's own PyTorch outputs (random weights)."""
    import torch
    from ultralytics import YOLO

    from vdet.inference.backends.onnxruntime import OnnxRuntimeBackend

    checkpoint = tmp_path / "model.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        YOLO(model).save(checkpoint)
    onnx_path = tmp_path / "model.onnx"
    args = [str(checkpoint), "--output", str(onnx_path), "--imgsz", "320"]
    rc, out, _ = _export(args + (["--dynamic"] if dynamic else []), capsys)
    assert rc == 0
    report = json.loads(out)
    assert report["input_hw"] == [320, 320] and len(report["classes"]) == 80
    assert report["batch"] == (None if dynamic else 1)

    batch = 2 if dynamic else 1
    x = np.random.default_rng(0).random((batch, 3, 320, 320), dtype=np.float32)
    with OnnxRuntimeBackend(onnx_path, threads=2) as backend:
        raw = backend.infer(x)
    assert raw.shape == (batch, 84, 2100)  # 40*40 + 20*20 + 10*10 anchors
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net = YOLO(checkpoint).model.float().eval()
        with torch.no_grad():
            expected = net(torch.from_numpy(x))[0].numpy()
    np.testing.assert_allclose(raw, expected, rtol=1e-3, atol=1e-2)


@pytest.mark.parametrize(("model", "head"), [("yolov8n.yaml", "22"), ("yolo11n.yaml", "23")])
def test_the_cpu_quantizer_finds_the_detect_head_of_an_export(
    capsys: pytest.CaptureFixture[str], model: str, head: str
) -> None:
    """`vdet quantize` finds the head as the Ultralytics module that produces the output (not
    always 22): the CPU target keeps its own operators float, and both targets keep its DFL and
    box-branch convs (DEFAULT_NODES_TO_EXCLUDE) float there."""
    from vdet.modelkit.quantize import default_nodes_to_exclude, detect_head

    rc, _, _ = _export([model, "--output", "model.onnx", "--imgsz", "320"], capsys)
    assert rc == 0
    proto = onnx.load("model.onnx")
    assert detect_head(proto) == rf"/model\.{head}/"
    patterns = default_nodes_to_exclude(proto)
    names = [node.name for node in proto.graph.node]
    assert len(patterns) == 2
    for pattern in patterns:
        assert pattern.startswith(rf"/model\.{head}/")
        assert any(re.match(pattern, name) for name in names), pattern


def test_export_rejects_a_classification_model(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _export(["yolov8n-cls.yaml", "--output", "cls.onnx"], capsys)
    assert rc == 2
    assert "detection models only" in err or "Detect" in err


def test_export_missing_checkpoint(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _export(["missing.pt", "--output", "x.onnx"], capsys)
    assert rc == 2 and "no such checkpoint" in err


def test_export_rejects_old_opset(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _export(["yolov8n.yaml", "--output", "x.onnx", "--opset", "12"], capsys)
    assert rc == 2 and "opset 12" in err
