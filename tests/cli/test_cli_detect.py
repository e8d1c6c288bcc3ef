"""`vdet detect` on the committed sample clip finds its labelled objects."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import av
import cv2
import numpy as np
import pytest
from support import truth
from support.truth import SAMPLE, TRUTH

from vdet.cli.main import main


def recall(records: list[dict[str, Any]]) -> float:
    return truth.recall([(r["frame_index"], r["detections"]) for r in records])


@pytest.mark.slow
def test_detect_on_sample_clip_recalls_labelled_objects(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "annotated.mp4"
    assert (
        main(
            [
                "detect",
                str(SAMPLE),
                "--backend",
                "onnxruntime",
                "--max-frames",
                "45",
                "--output",
                str(out),
            ]
        )
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["frame_index"] for r in records] == list(range(45))
    for r in records:
        for d in r["detections"]:
            assert set(d) == {"class_name", "class_id", "score", "box", "track_id"}
        assert set(r) == {
            "frame_index",
            "pts_s",
            "image_width",
            "image_height",
            "detections",
            "timings_ms",
        }
    assert recall(records) >= 0.9
    with av.open(str(out)) as container:
        assert sum(1 for _ in container.decode(video=0)) == 45


@pytest.mark.slow
def test_swapping_red_and_blue_flips_the_swapped_classes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The class design catches a BGR/RGB mix-up: a swapped frame loses the paired classes."""
    with av.open(str(SAMPLE)) as container:
        frame = next(container.decode(video=0)).to_ndarray(format="bgr24")
    swapped = tmp_path / "swapped.png"
    cv2.imwrite(str(swapped), np.ascontiguousarray(frame[:, :, ::-1]))
    assert main(["detect", str(swapped), "--backend", "onnxruntime"]) == 0
    record = json.loads(capsys.readouterr().out)
    paired = {0, 1, 3, 4}
    truth = [o for o in TRUTH["frames"][0]["objects"] if o["class_id"] in paired]
    assert truth, "the first frame should show some paired-class objects"
    assert recall([record]) < 0.5


def test_detect_image_writes_annotated_copy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with av.open(str(SAMPLE)) as container:
        frame = next(container.decode(video=0)).to_ndarray(format="bgr24")
    image, out = tmp_path / "f.jpg", tmp_path / "annotated.png"
    cv2.imwrite(str(image), frame)
    assert main(["detect", str(image), "--classes", "red_circle,4", "--output", str(out)]) == 0
    record = json.loads(capsys.readouterr().out)
    assert {d["class_id"] for d in record["detections"]} <= {0, 4}
    annotated = cv2.imread(str(out))
    assert annotated is not None and annotated.shape == frame.shape


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["detect", "/no/such/image.jpg"], "cannot read image"),
        (["detect", "ftp://camera/stream"], "unsupported source scheme"),
        (["detect", "x.jpg", "--classes", "zebra"], "unknown class"),
        (["detect", "x.jpg", "--conf", "1.5"], "conf_threshold"),
        (["detect", "x.jpg", "--model", "/no/model.onnx"], "model.onnx"),
    ],
)
def test_detect_bad_input(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(args) == 2
    assert message in capsys.readouterr().err
