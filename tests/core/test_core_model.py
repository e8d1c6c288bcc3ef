"""load_model_info on small hand-built ONNX graphs, and optionally on a real YOLOv8n export."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from onnx import TensorProto

from vdet.core.model import ModelError, ModelInfo, load_model_info

HeadModelWriter = Callable[..., Path]  # the conftest fixture
NAMES = {"names": "{0: 'person', 1: 'car'}"}


def test_static_ultralytics_style_model(write_head_model: HeadModelWriter) -> None:
    path = write_head_model(
        nc=2,
        num_anchors=6,
        batch=1,
        input_hw=(32, 48),
        metadata={**NAMES, "imgsz": "[32, 48]", "stride": "16", "batch": "1", "task": "detect"},
    )
    info = load_model_info(path)
    assert info == ModelInfo(
        path=path,
        names=("person", "car"),
        input_hw=(32, 48),
        num_classes=2,
        batch=1,
        sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
        stride=16,
        num_anchors=6,
    )


def test_dynamic_model_takes_size_from_metadata(write_head_model: HeadModelWriter) -> None:
    path = write_head_model(
        nc=2,
        batch="batch",
        input_hw=("height", "width"),
        output_shape=["batch", "rows", "anchors"],
        metadata={**NAMES, "imgsz": "[64, 96]", "batch": "1"},
    )
    info = load_model_info(path)
    assert info.batch is None  # the graph, not the metadata, decides
    assert info.input_hw == (64, 96)
    assert info.num_anchors is None
    assert info.names == ("person", "car")


def test_zero_dims_mean_unknown(write_head_model: HeadModelWriter) -> None:
    # Some exporters write 0 instead of a symbolic name for a dynamic dimension.
    info = load_model_info(write_head_model(nc=2, batch=0, metadata=NAMES))
    assert info.batch is None


def test_names_default_to_class_indices(write_head_model: HeadModelWriter) -> None:
    info = load_model_info(write_head_model(nc=3))
    assert info.names == ("0", "1", "2")
    assert info.num_classes == 3
    assert info.stride == 32


def test_names_may_be_a_list(write_head_model: HeadModelWriter) -> None:
    path = write_head_model(nc=2, metadata={"names": "['a', 'b']"})
    assert load_model_info(path).names == ("a", "b")


def test_float16_model_is_accepted(write_head_model: HeadModelWriter) -> None:
    path = write_head_model(nc=2, input_type=TensorProto.FLOAT16)
    assert load_model_info(path).input_hw == (32, 32)


ERROR_CASES = [
    pytest.param({"extra_output": True}, "exactly one output", id="two-outputs"),
    pytest.param({"metadata": {"names": "{0: 'a', 1: 'b', 2: 'c'}"}}, "4 \\+ 3", id="nc-mismatch"),
    pytest.param(
        {"nc": 2, "num_anchors": 6, "output_shape": [1, 6, 6], "metadata": NAMES},
        None,
        id="square-output-is-fine",
    ),
    pytest.param(
        {"output_shape": [1, 300, 6], "metadata": NAMES}, "anchors first", id="anchors-first"
    ),
    pytest.param({"output_shape": [1, 6]}, "rank 3", id="output-rank"),
    pytest.param({"output_shape": [1, 4, 6]}, "no class rows", id="no-classes"),
    pytest.param(
        {"output_shape": [1, "rows", 6]}, "cannot tell the number of classes", id="symbolic-nc"
    ),
    pytest.param({"input_shape": [1, 1, 32, 32]}, "3 channels", id="gray-input"),
    pytest.param({"input_shape": [1, 32, 32, 3]}, "NHWC", id="nhwc-input"),
    pytest.param({"input_shape": [1, 3, 32]}, "rank 4", id="input-rank"),
    pytest.param({"input_type": TensorProto.UINT8}, "float32 or float16", id="uint8-input"),
    pytest.param({"metadata": {"task": "segment"}}, "'segment'", id="segment-task"),
    pytest.param({"metadata": {"end2end": "True"}}, "end-to-end", id="end2end"),
    pytest.param({"metadata": {"channels": "1"}}, "channels", id="channels"),
    pytest.param({"input_hw": ("h", "w")}, "no 'imgsz' metadata", id="dynamic-size-without-imgsz"),
    pytest.param({"metadata": {"imgsz": "[640, 640]"}}, "disagrees", id="imgsz-mismatch"),
    pytest.param({"metadata": {"imgsz": "[640]"}}, "\\[height, width\\]", id="imgsz-malformed"),
    pytest.param({"metadata": {"names": "{0: 'a'"}}, "not a Python literal", id="names-syntax"),
    pytest.param({"metadata": {"names": "{1: 'a', 2: 'b'}"}}, "ids must be", id="names-ids"),
    pytest.param({"metadata": {"names": "{}"}}, "non-empty", id="names-empty"),
    pytest.param({"metadata": {"stride": "0"}}, "stride", id="stride"),
]


@pytest.mark.parametrize(("kwargs", "match"), ERROR_CASES)
def test_unsupported_models_are_rejected(
    write_head_model: HeadModelWriter, kwargs: dict[str, Any], match: str | None
) -> None:
    kwargs.setdefault("nc", 2)
    path = write_head_model(**kwargs)
    if match is None:
        load_model_info(path)
        return
    with pytest.raises(ModelError, match=match):
        load_model_info(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not found"):
        load_model_info(tmp_path / "absent.onnx")


def test_garbage_file(tmp_path: Path) -> None:
    path = tmp_path / "garbage.onnx"
    path.write_bytes(b"\x00\x01 this is not protobuf \xff" * 10)
    with pytest.raises(ModelError, match="not a readable ONNX model"):
        load_model_info(path)


def test_model_error_is_a_value_error() -> None:
    assert issubclass(ModelError, ValueError)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_classes": 3}, "num_classes"),
        ({"names": (), "num_classes": 0}, "at least one class"),
        ({"input_hw": (0, 640)}, "input_hw"),
        ({"batch": 0}, "batch"),
    ],
)
def test_model_info_validation(kwargs: dict[str, Any], match: str) -> None:
    fields: dict[str, Any] = {
        "path": Path("m.onnx"),
        "names": ("a", "b"),
        "input_hw": (640, 640),
        "num_classes": 2,
        "batch": 1,
        "sha256": "0" * 64,
    }
    with pytest.raises(ValueError, match=match):
        ModelInfo(**{**fields, **kwargs})


YoloExporter = Callable[[int | tuple[int, int], bool], tuple[object, Path]]  # conftest


@pytest.mark.slow
@pytest.mark.train
def test_real_yolov8n_export(yolov8n_export: YoloExporter) -> None:
    _, path = yolov8n_export((256, 320), True)
    info = load_model_info(path)
    assert info.num_classes == 80
    assert info.input_hw == (256, 320)
    assert info.batch is None
    assert info.stride == 32
    assert info.num_anchors is None
