"""Helpers for API tests: a real tiny ONNX detection model and request bodies.

The model is a real ONNX graph run by the real ONNX Runtime backend through the real Detector:
its head is fixed, so every frame yields the same three boxes (one per class, scores 0.9 / 0.6
/ 0.3), which makes thresholds, class filters and box mapping checkable end to end.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from vdet.config.settings import Settings

with warnings.catch_warnings():
    # starlette.testclient warns when it runs on httpx instead of httpx2.
    warnings.filterwarnings("ignore", "Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient
    from starlette.testclient import WebSocketDenialResponse

__all__ = [
    "ANCHORS",
    "CLASS_NAMES",
    "CLIP_WH",
    "INPUT_HW",
    "MakeSettings",
    "TestClient",
    "WebSocketDenialResponse",
    "expected_box",
    "stream_body",
    "write_tiny_model",
]

CLASS_NAMES = ("person", "car", "dog")
INPUT_HW = (64, 64)
# Anchors as (cx, cy, w, h) in input pixels and their per-class scores.
ANCHORS = [
    ((32.0, 32.0, 16.0, 16.0), (0.9, 0.05, 0.05)),  # person 0.9
    ((16.0, 20.0, 8.0, 8.0), (0.05, 0.6, 0.05)),  # car 0.6
    ((48.0, 44.0, 8.0, 8.0), (0.05, 0.05, 0.3)),  # dog 0.3
    ((10.0, 50.0, 4.0, 4.0), (0.01, 0.01, 0.01)),  # below every threshold
]
CLIP_WH = (128, 96)  # letterboxed into 64x64 at gain 0.5 with 8 px of padding top and bottom


def expected_box(anchor: int, source_wh: tuple[int, int] = CLIP_WH) -> list[float]:
    """Where anchor `anchor`'s box lands in source pixels (letterbox undone)."""
    (cx, cy, w, h), _ = ANCHORS[anchor]
    sw, sh = source_wh
    gain = min(INPUT_HW[0] / sh, INPUT_HW[1] / sw)
    pad_x = (INPUT_HW[1] - round(sw * gain)) / 2
    pad_y = (INPUT_HW[0] - round(sh * gain)) / 2
    return [
        (cx - w / 2 - pad_x) / gain,
        (cy - h / 2 - pad_y) / gain,
        (cx + w / 2 - pad_x) / gain,
        (cy + h / 2 - pad_y) / gain,
    ]


def write_tiny_model(path: Path) -> Path:
    """[1, 3, 64, 64] -> [1, 4 + 3, 4]: the fixed head above (+ 0 x the image mean)."""
    head = np.zeros((1, 4 + len(CLASS_NAMES), len(ANCHORS)), np.float32)
    for i, (box, scores) in enumerate(ANCHORS):
        head[0, :4, i] = box
        head[0, 4:, i] = scores
    nodes = [
        helper.make_node("ReduceMean", ["images"], ["mean"], axes=[1, 2, 3], keepdims=1),
        helper.make_node("Reshape", ["mean", "shape3"], ["mean3"]),
        helper.make_node("Mul", ["mean3", "zero"], ["nothing"]),
        helper.make_node("Add", ["nothing", "head"], ["output0"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_head",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, *INPUT_HW])],
        [
            helper.make_tensor_value_info(
                "output0", TensorProto.FLOAT, [1, 4 + len(CLASS_NAMES), len(ANCHORS)]
            )
        ],
        [
            numpy_helper.from_array(np.array([-1, 1, 1], np.int64), "shape3"),
            numpy_helper.from_array(np.zeros((1, 1, 1), np.float32), "zero"),
            numpy_helper.from_array(head, "head"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    helper.set_model_props(
        model,
        {
            "names": repr(dict(enumerate(CLASS_NAMES))),
            "imgsz": repr(list(INPUT_HW)),
            "task": "detect",
        },
    )
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


MakeSettings = Callable[..., Settings]


def stream_body(clip: Path, stream_id: str = "cam", **fields: Any) -> dict[str, Any]:
    """A POST /v1/streams body for the test clip, looping in real time by default."""
    return {"id": stream_id, "url": str(clip), "loop": True, "realtime": True, **fields}
