"""Tiny ONNX graphs that stand in for a detection model, built with onnx.helper.

`write_head_model` writes a graph whose output is a fixed head [B, 4 + nc, N] plus, per image,
`input_gain` times the image's mean value, so tests can both place known boxes and check that
each output row belongs to the right input image. `yolov8n_export` exports a randomly initialised
YOLOv8n through Ultralytics (skipped without it; no weights are downloaded).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

# Keep Ultralytics (used only as a reference in some tests) from reaching the network.
os.environ.setdefault("YOLO_OFFLINE", "1")

Dim = int | str


class HeadModelWriter(Protocol):
    def __call__(
        self,
        *,
        nc: int = ...,
        num_anchors: int = ...,
        batch: Dim = ...,
        input_hw: tuple[Dim, Dim] = ...,
        head: np.ndarray | None = ...,
        input_gain: float = ...,
        metadata: dict[str, str] | None = ...,
        names: Sequence[str] | None = ...,
        input_shape: Sequence[Dim] | None = ...,
        output_shape: Sequence[Dim] | None = ...,
        extra_output: bool = ...,
        input_type: int = ...,
        filename: str = ...,
    ) -> Path: ...


def _write_head_model(
    tmp_path: Path,
    *,
    nc: int = 2,
    num_anchors: int = 6,
    batch: Dim = 1,
    input_hw: tuple[Dim, Dim] = (32, 32),
    head: np.ndarray | None = None,
    input_gain: float = 0.0,
    metadata: dict[str, str] | None = None,
    names: Sequence[str] | None = None,
    input_shape: Sequence[Dim] | None = None,
    output_shape: Sequence[Dim] | None = None,
    extra_output: bool = False,
    input_type: int = TensorProto.FLOAT,
    filename: str = "head.onnx",
) -> Path:
    rows = 4 + nc
    if head is None:
        head = np.zeros((rows, num_anchors), np.float32)
    head = np.asarray(head, np.float32).reshape(1, rows, num_anchors)
    in_shape = list(input_shape) if input_shape is not None else [batch, 3, *input_hw]
    out_shape = list(output_shape) if output_shape is not None else [batch, rows, num_anchors]

    nodes = []
    image = "images"
    if input_type != TensorProto.FLOAT:
        nodes.append(helper.make_node("Cast", ["images"], ["images_f32"], to=TensorProto.FLOAT))
        image = "images_f32"
    nodes += [
        helper.make_node("ReduceMean", [image], ["mean"], axes=[1, 2, 3], keepdims=1),
        helper.make_node("Reshape", ["mean", "mean_shape"], ["mean3"]),
        helper.make_node("Mul", ["mean3", "gain"], ["scaled"]),
        helper.make_node("Add", ["scaled", "head"], ["output0"]),
    ]
    initializers = [
        numpy_helper.from_array(np.array([-1, 1, 1], np.int64), "mean_shape"),
        numpy_helper.from_array(np.array(input_gain, np.float32), "gain"),
        numpy_helper.from_array(head, "head"),
    ]
    outputs = [helper.make_tensor_value_info("output0", TensorProto.FLOAT, out_shape)]
    if extra_output:
        nodes.append(helper.make_node("Identity", ["mean"], ["protos"]))
        outputs.append(helper.make_tensor_value_info("protos", TensorProto.FLOAT, None))
    graph = helper.make_graph(
        nodes,
        "head",
        [helper.make_tensor_value_info("images", input_type, in_shape)],
        outputs,
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    props = {}
    if names is not None:
        props["names"] = repr(dict(enumerate(names)))
    props.update(metadata or {})
    helper.set_model_props(model, props)
    path = tmp_path / filename
    onnx.save(model, str(path))
    return path


@pytest.fixture
def write_head_model(tmp_path: Path) -> HeadModelWriter:
    def write(**kwargs: object) -> Path:
        return _write_head_model(tmp_path, **kwargs)  # type: ignore[arg-type]

    return write


@pytest.fixture
def make_head() -> Callable[[Sequence[Sequence[float]], Sequence[Sequence[float]]], np.ndarray]:
    """Build one image's head [4 + nc, N] from (N, 4) cxcywh boxes and (N, nc) class scores."""

    def make(
        boxes_cxcywh: Sequence[Sequence[float]], scores: Sequence[Sequence[float]]
    ) -> np.ndarray:
        boxes = np.asarray(boxes_cxcywh, np.float32).reshape(-1, 4)
        cls = np.asarray(scores, np.float32)
        if cls.ndim != 2 or len(cls) != len(boxes):
            raise ValueError(f"scores must be ({len(boxes)}, nc), got {cls.shape}")
        return np.ascontiguousarray(np.concatenate([boxes, cls], axis=1).T)

    return make


YoloExport = tuple[object, Path]  # (the Ultralytics YOLO object, its exported .onnx)


@pytest.fixture(scope="session")
def yolov8n_export(
    tmp_path_factory: pytest.TempPathFactory,
) -> Callable[[int | tuple[int, int], bool], YoloExport]:
    """Export a randomly initialised YOLOv8n to ONNX at (imgsz, dynamic); cached per session."""
    cache: dict[tuple[object, bool], YoloExport] = {}

    def export(imgsz: int | tuple[int, int], dynamic: bool) -> YoloExport:
        if (imgsz, dynamic) in cache:
            return cache[imgsz, dynamic]
        ultralytics = pytest.importorskip("ultralytics")
        folder = tmp_path_factory.mktemp("yolov8n")
        previous = Path.cwd()
        os.chdir(folder)  # the exporter writes next to the (yaml) model name, i.e. here
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the exporter's own deprecation noise
                model = ultralytics.YOLO("yolov8n.yaml")
                size = list(imgsz) if isinstance(imgsz, tuple) else imgsz
                exported = model.export(format="onnx", imgsz=size, simplify=False, dynamic=dynamic)
        finally:
            os.chdir(previous)
        cache[imgsz, dynamic] = (model, Path(folder, exported).resolve())
        return cache[imgsz, dynamic]

    return export
