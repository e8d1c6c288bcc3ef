"""`vdet bench pipeline --baseline ultralytics`: box matching, and one short real run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from vdet.bench.ultralytics import match_count
from vdet.cli.main import main
from vdet.core.assets import assets_dir

ASSETS = assets_dir()


@pytest.mark.parametrize(
    ("a", "a_cls", "b", "b_cls", "expected"),
    [
        (np.zeros((0, 4)), [], np.zeros((0, 4)), [], 0),  # nothing on either side
        ([[0, 0, 10, 10]], [1], np.zeros((0, 4)), [], 0),
        ([[0, 0, 10, 10]], [1], [[0, 0, 10, 10]], [1], 1),
        ([[0, 0, 10, 10]], [1], [[0, 0, 10, 10]], [2], 0),  # another class is no match
        ([[0, 0, 10, 10]], [1], [[5, 0, 15, 10]], [1], 0),  # IoU 1/3
        ([[0, 0, 10, 10]], [1], [[1, 0, 11, 10]], [1], 1),  # IoU 9/11
        # one-to-one: two boxes on one partner match once
        ([[0, 0, 10, 10], [0, 0, 10, 10]], [1, 1], [[0, 0, 10, 10]], [1], 1),
    ],
)
def test_match_count(
    a: object, a_cls: list[int], b: object, b_cls: list[int], expected: int
) -> None:
    got = match_count(
        np.asarray(a, np.float32), np.asarray(a_cls), np.asarray(b, np.float32), np.asarray(b_cls)
    )
    assert got == expected


def test_baseline_refuses_other_backends(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "pipeline", "--baseline", "ultralytics", "--backend", "torch"]) == 2
    assert "ONNX Runtime on the CPU" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.train
def test_vdet_and_ultralytics_alternate_and_agree(tmp_path: Path) -> None:
    pytest.importorskip("ultralytics")
    if not (ASSETS / "demo.onnx").is_file():
        pytest.skip("service/vdet/assets/demo.onnx is not present")
    out = tmp_path / "vs.json"
    args = ["bench", "pipeline", "--baseline", "ultralytics", "--frames", "6", "--warmup", "2"]
    assert main([*args, "--output", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["frames"] == 6
    assert {name: times["n"] for name, times in result["ms_per_frame"].items()} == {
        "vdet": 6,
        "ultralytics": 6,
        "vdet_one_frame": 6,
    }
    assert all(fps > 0 for fps in result["frames_per_s"].values())
    boxes = result["boxes"]
    assert boxes["frames_compared"] == 8 and boxes["ultralytics"] > 0
    assert boxes["ultralytics_found_by_vdet"] >= 0.99 and boxes["vdet_found_by_ultralytics"] >= 0.99
