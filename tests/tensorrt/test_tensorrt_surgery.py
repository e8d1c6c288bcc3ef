"""vdet.tensorrt.surgery on the CPU: the VdetDecodeNms node after the raw head.

Checks the rewritten graph the way TensorRT's ONNX parser will read it (op type, plugin_version
and plugin_namespace strings, field attributes with ONNX INT/FLOAT types, outputs) and that the
network before the node is untouched: the graph cut at the head runs in ONNX Runtime and gives
the original model's output bit for bit. TensorRT itself is not involved here.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from vdet.core.assets import asset_path
from vdet.inference.postprocess import PostprocessParams
from vdet.tensorrt.surgery import (
    DETECTIONS,
    NUM_DETECTIONS,
    PLUGIN_DOMAIN,
    PLUGIN_NAMESPACE,
    PLUGIN_OP,
    PLUGIN_VERSION,
    DecodeNmsAttributes,
    SurgeryError,
    add_decode_nms,
    add_decode_nms_file,
    check_plugin_model,
    has_plugin_node,
    head_model,
    plugin_node,
)

DEMO = asset_path("demo.onnx")

pytest.importorskip("onnx_graphsurgeon")


def _run(model: onnx.ModelProto | Path, x: np.ndarray) -> list[np.ndarray]:
    source = str(model) if isinstance(model, Path) else model.SerializeToString()
    session = ort.InferenceSession(source, providers=["CPUExecutionProvider"])
    return [np.asarray(o) for o in session.run(None, {session.get_inputs()[0].name: x})]


def _attributes(node: onnx.NodeProto) -> dict[str, object]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _dims(value: onnx.ValueInfoProto) -> list[int | str]:
    return [
        d.dim_param if d.HasField("dim_param") else d.dim_value
        for d in value.type.tensor_type.shape.dim
    ]


def _half_head_model(path: Path, nc: int = 2) -> Path:
    """A tiny 'detector' whose raw head is float16: Reshape of the image, then a Cast."""
    rows, anchors = 4 + nc, 3 * 8 * 8 // (4 + nc)
    graph = helper.make_graph(
        [
            helper.make_node("Reshape", ["images", "shape"], ["flat"]),
            helper.make_node("Cast", ["flat"], ["output0"], to=TensorProto.FLOAT16),
        ],
        "half_head",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, 8, 8])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT16, ["batch", rows, anchors])],
        initializer=[helper.make_tensor("shape", TensorProto.INT64, [3], [-1, rows, anchors])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def demo_nms(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not DEMO.is_file():
        pytest.skip("service/vdet/assets/demo.onnx is not present")
    out = tmp_path_factory.mktemp("surgery") / "demo.nms.onnx"
    add_decode_nms_file(DEMO, out, DecodeNmsAttributes())
    return out


def test_demo_graph_has_the_plugin_node_tensorrt_expects(demo_nms: Path) -> None:
    model = onnx.load(str(demo_nms))
    onnx.checker.check_model(model, full_check=True)  # our domain is imported; no schema needed
    check_plugin_model(model)

    node = plugin_node(model)
    assert node is not None
    assert node.op_type == PLUGIN_OP == "VdetDecodeNms"
    assert node.domain == PLUGIN_DOMAIN
    assert (PLUGIN_DOMAIN, 1) in [(o.domain, o.version) for o in model.opset_import]
    assert list(node.input) == ["output0"]  # the demo's raw head, now an internal tensor
    assert list(node.output) == [DETECTIONS, NUM_DETECTIONS]
    attrs = _attributes(node)
    assert attrs == {
        "score_threshold": pytest.approx(0.25),
        "iou_threshold": pytest.approx(0.45),
        "top_k": 1000,
        "max_det": 300,
        "class_agnostic": 0,
        "plugin_version": PLUGIN_VERSION.encode(),
        "plugin_namespace": PLUGIN_NAMESPACE.encode(),
    }
    types = {a.name: a.type for a in node.attribute}
    assert types["score_threshold"] == types["iou_threshold"] == onnx.AttributeProto.FLOAT
    assert types["top_k"] == types["max_det"] == types["class_agnostic"] == onnx.AttributeProto.INT
    # Thresholds are stored as float32, the precision the reference compares in.
    assert attrs["iou_threshold"] == float(np.float32(0.45))

    dets, nums = model.graph.output
    assert (dets.name, nums.name) == (DETECTIONS, NUM_DETECTIONS)
    assert dets.type.tensor_type.elem_type == TensorProto.FLOAT
    assert nums.type.tensor_type.elem_type == TensorProto.INT32
    assert _dims(dets) == ["batch", 300, 6]  # the demo's symbolic batch is kept
    assert _dims(nums) == ["batch"]


def test_metadata_survives_and_records_the_plugin(demo_nms: Path) -> None:
    original = {
        p.key: p.value for p in onnx.load(str(DEMO), load_external_data=False).metadata_props
    }
    rewritten = {p.key: p.value for p in onnx.load(str(demo_nms)).metadata_props}
    assert {k: rewritten[k] for k in original} == original
    assert json.loads(rewritten["vdet_decode_nms"]) == {
        "score_threshold": 0.25,
        "iou_threshold": 0.45,
        "top_k": 1000,
        "max_det": 300,
        "class_agnostic": False,
    }


def test_graph_up_to_the_head_still_runs_in_onnxruntime(demo_nms: Path) -> None:
    x = np.random.default_rng(0).random((2, 3, 640, 640), dtype=np.float32)
    (expected,) = _run(DEMO, x)
    head = head_model(onnx.load(str(demo_nms)))
    onnx.checker.check_model(head, full_check=True)
    assert plugin_node(head) is None
    assert all(o.domain != PLUGIN_DOMAIN for o in head.opset_import)
    (got,) = _run(head, x)
    assert got.shape == expected.shape == (2, 10, 8400)
    np.testing.assert_array_equal(got, expected)


def test_the_plugin_graph_itself_is_tensorrt_only(demo_nms: Path) -> None:
    """ONNX Runtime has no VdetDecodeNms kernel: the end-to-end graph is for TensorRT only."""
    with pytest.raises(Exception, match=PLUGIN_OP):
        ort.InferenceSession(str(demo_nms), providers=["CPUExecutionProvider"])


def test_attributes_follow_postprocess_params(tmp_path: Path) -> None:
    params = PostprocessParams(conf_threshold=0.4, iou_threshold=0.6, top_k=200, max_det=50)
    attrs = DecodeNmsAttributes.from_params(params)
    model = add_decode_nms(onnx.load(str(DEMO)), attrs)
    node = plugin_node(model)
    assert node is not None
    values = _attributes(node)
    assert values["score_threshold"] == float(np.float32(0.4))
    assert (values["top_k"], values["max_det"]) == (200, 50)
    assert _dims(model.graph.output[0]) == ["batch", 50, 6]
    with pytest.raises(SurgeryError, match="class filter"):
        DecodeNmsAttributes.from_params(PostprocessParams(classes=frozenset({0})))


def test_float16_head_and_static_batch(tmp_path: Path) -> None:
    source = _half_head_model(tmp_path / "half.onnx")
    result = add_decode_nms_file(source, tmp_path / "half.nms.onnx", DecodeNmsAttributes(max_det=7))
    assert result.head_shape == ("batch", 6, 32)
    assert result.detections_shape == ("batch", 7, 6)
    model = onnx.load(str(result.output))
    assert model.graph.output[0].type.tensor_type.elem_type == TensorProto.FLOAT  # always fp32
    x = np.random.default_rng(1).random((3, 3, 8, 8), dtype=np.float32)
    (head,) = _run(head_model(model), x)
    assert head.dtype == np.float16 and head.shape == (3, 6, 32)
    np.testing.assert_array_equal(head, _run(source, x)[0])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"score_threshold": 1.5}, "score_threshold"),
        ({"iou_threshold": -0.1}, "iou_threshold"),
        ({"score_threshold": True}, "score_threshold"),
        ({"top_k": 0}, "top_k"),
        ({"top_k": 4097}, "4096"),
        ({"max_det": 0}, "max_det"),
        ({"max_det": 2.0}, "max_det"),
        ({"class_agnostic": 1}, "class_agnostic"),
    ],
)
def test_attribute_validation(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(SurgeryError, match=match):
        DecodeNmsAttributes(**kwargs)  # type: ignore[arg-type]


def test_refusals(tmp_path: Path, demo_nms: Path) -> None:
    once = onnx.load(str(demo_nms))
    with pytest.raises(SurgeryError, match="already has"):
        add_decode_nms(once, DecodeNmsAttributes())
    # The rewritten model is not a raw-head model any more: the file API refuses it.
    with pytest.raises(SurgeryError, match="exactly one output"):
        add_decode_nms_file(demo_nms, tmp_path / "twice.onnx", DecodeNmsAttributes())
    # Without the domain's opset import ONNX's checker rejects the node.
    broken = onnx.load(str(demo_nms))
    kept = [o for o in broken.opset_import if o.domain != PLUGIN_DOMAIN]
    del broken.opset_import[:]
    broken.opset_import.extend(kept)
    with pytest.raises(SurgeryError, match="ONNX checker"):
        check_plugin_model(broken)
    assert has_plugin_node(demo_nms) and not has_plugin_node(DEMO)


@pytest.mark.slow
@pytest.mark.train
@pytest.mark.parametrize("dynamic", [False, True])
def test_yolov8s_from_the_ultralytics_yaml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dynamic: bool
) -> None:
    """A real YOLOv8s graph (random weights, 80 classes) through the surgery."""
    pytest.importorskip("ultralytics")
    monkeypatch.setenv("YOLO_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # Ultralytics writes next to a .yaml model's name
    from vdet.modelkit.export import export_onnx

    onnx_path = tmp_path / "yolov8s.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Ultralytics' and torch.onnx's own deprecation noise
        info = export_onnx("yolov8s.yaml", onnx_path, imgsz=320, dynamic_batch=dynamic)
    assert info.num_classes == 80

    attrs = DecodeNmsAttributes(score_threshold=0.3, top_k=500, max_det=100, class_agnostic=True)
    result = add_decode_nms_file(onnx_path, tmp_path / "yolov8s.nms.onnx", attrs)
    batch: int | str = result.head_shape[0] if dynamic else 1
    assert result.head_shape[1:] == ((84, "anchors") if dynamic else (84, 2100))
    assert result.detections_shape == (batch, 100, 6)
    assert result.num_detections_shape == (batch,)
    model = onnx.load(str(result.output))
    check_plugin_model(model)
    node = plugin_node(model)
    assert node is not None and _attributes(node)["class_agnostic"] == 1
    assert len(model.graph.node) == len(onnx.load(str(onnx_path)).graph.node) + 1

    n = 2 if dynamic else 1
    x = np.random.default_rng(2).random((n, 3, 320, 320), dtype=np.float32)
    (expected,) = _run(onnx_path, x)
    (got,) = _run(head_model(model), x)
    assert got.shape == (n, 84, 2100)
    np.testing.assert_array_equal(got, expected)
    assert os.path.getsize(result.output) > 10_000_000  # the weights came along
