"""COCO scoring against a hand-computed case, and `vdet eval` end to end on the demo model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from faster_coco_eval import COCO

from vdet.cli.main import main
from vdet.modelkit.evaluation import score_detections

NAMES = ("a", "b")


def _gt(tmp_path: Path) -> COCO:
    data = {
        "images": [{"id": 1, "file_name": "x.jpg", "width": 400, "height": 400}],
        "annotations": [
            {
                "id": 1,
                "image_id": 1,
                "category_id": 0,
                "bbox": [0, 0, 100, 100],
                "area": 10000,
                "iscrowd": 0,
            },
            {
                "id": 2,
                "image_id": 1,
                "category_id": 0,
                "bbox": [200, 200, 100, 100],
                "area": 10000,
                "iscrowd": 0,
            },
        ],
        "categories": [{"id": 0, "name": "a"}, {"id": 1, "name": "b"}],
    }
    path = tmp_path / "gt.json"
    path.write_text(json.dumps(data))
    return COCO(str(path))


def _det(box: list[float], score: float, cls: int = 0) -> dict[str, object]:
    return {"image_id": 1, "category_id": cls, "score": score, "bbox": box}


def test_perfect_detections_score_one(tmp_path: Path) -> None:
    scores = score_detections(
        _gt(tmp_path), [_det([0, 0, 100, 100], 0.9), _det([200, 200, 100, 100], 0.8)], NAMES
    )
    assert scores["map50_95"] == 1.0 and scores["map50"] == 1.0


def test_hand_computed_partial_overlap(tmp_path: Path) -> None:
    """Second box shifted 20 px: IoU 80/120 = 0.667, a hit at IoU 0.50..0.65 (4 of 10 levels).

    Where it misses, recall stops at 0.5 with precision 1: the 101-point AP is 51/101.
    mAP50-95 = (4 * 1 + 6 * 51/101) / 10 = 0.70297.
    """
    scores = score_detections(
        _gt(tmp_path), [_det([0, 0, 100, 100], 0.9), _det([220, 200, 100, 100], 0.8)], NAMES
    )
    assert scores["map50"] == 1.0
    assert scores["map75"] == pytest.approx(51 / 101, abs=1e-4)
    assert scores["map50_95"] == pytest.approx((4 + 6 * 51 / 101) / 10, abs=1e-4)


def test_wrong_class_scores_zero_and_no_detections_score_zero(tmp_path: Path) -> None:
    gt = _gt(tmp_path)
    assert score_detections(gt, [_det([0, 0, 100, 100], 0.9, cls=1)], NAMES)["map50"] == 0.0
    assert score_detections(gt, [], NAMES)["map50_95"] == 0.0


@pytest.mark.slow
def test_vdet_eval_on_a_small_synthetic_set(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report.json"
    assert (
        main(
            [
                "eval",
                "--synthetic",
                "12",
                "--cache-dir",
                str(tmp_path),
                "--backend",
                "onnxruntime",
                "--output",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    assert report["images"] == 12 and report["backend"] == "onnxruntime"
    assert report["map50"] > 0.8  # the committed 500-image figure is the real measure
    assert json.loads(capsys.readouterr().out)["map50_95"] == report["map50_95"]


def test_vdet_eval_missing_coco_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "--coco", str(tmp_path / "nope.json")]) == 2
    assert "not found" in capsys.readouterr().err
