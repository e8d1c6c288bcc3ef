"""`vdet quantize --target cpu`: ONNX Runtime's static quantization of the demo model, in the form
its CPU kernels run fast (uint8 activations, int8 weights per output channel, the operators
between convolutions on uint8 too, the Detect head's own operators and its sensitive layers left
float), and that the result detects what the FP32 model does."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper
from support.truth import SAMPLE

from vdet.cli.main import main
from vdet.core.assets import asset_path
from vdet.core.model import load_model_info
from vdet.core.types import ImageArray, VideoFrame
from vdet.inference.detector import Detector
from vdet.ingest.reader import SourceReader
from vdet.modelkit import quantize as q

DEMO = asset_path("demo.onnx")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo_cpu_int8(tmp_path_factory: pytest.TempPathFactory) -> q.QuantizeResult:
    frames = q.collect_calibration_frames(SAMPLE, load_model_info(DEMO).input_hw, 16)
    out = tmp_path_factory.mktemp("cpu-int8") / "demo.cpu-int8.onnx"
    return q.quantize_onnx_for_cpu(DEMO, out, frames)


def _sample_frames(count: int) -> list[ImageArray]:
    images = []
    with SourceReader(str(SAMPLE)) as reader:
        reader.open()
        for item in reader.frames():
            if isinstance(item, VideoFrame) and item.index % 30 == 0:
                images.append(item.image_bgr)
            if len(images) == count:
                break
    return images


def test_convs_are_uint8_activations_and_per_channel_int8_weights(
    demo_cpu_int8: q.QuantizeResult,
) -> None:
    model = onnx.load(str(demo_cpu_int8.output))
    inits = {t.name: t for t in model.graph.initializer}
    producers = {out: node for node in model.graph.node for out in node.output}
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    excluded = [
        c.name for c in convs if any(re.match(p, c.name) for p in q.DEFAULT_NODES_TO_EXCLUDE)
    ]
    assert excluded and set(demo_cpu_int8.summary.float_convs) == set(excluded)
    assert len(demo_cpu_int8.summary.quantized_convs) == len(convs) - len(excluded)
    for conv in convs:
        if conv.name in excluded:
            continue
        activation, weight = producers[conv.input[0]], producers[conv.input[1]]
        assert activation.op_type == weight.op_type == "DequantizeLinear"
        assert inits[activation.input[2]].data_type == TensorProto.UINT8
        assert inits[weight.input[0]].data_type == TensorProto.INT8
        scales = numpy_helper.to_array(inits[weight.input[1]])
        assert scales.shape == (inits[weight.input[0]].dims[0],)  # one per output channel
    # Between convolutions every operator of `CPU_QUANTIZED_OPS` reads dequantized uint8 (ONNX
    # Runtime runs it as its QLinear* form). In the Detect head only convolutions are: a Q/DQ
    # pair there is a conv's input or output, so the head's output (boxes and scores side by
    # side) is never put on one uint8 scale.
    head = re.compile(r"/model\.22/")  # YOLOv8's Detect
    tensors = {i.name for i in model.graph.input} | set(inits)
    for node in model.graph.node:
        if node.op_type in q.CPU_QUANTIZED_OPS and not head.match(node.name):
            inputs = [producers.get(n) for n in node.input if n and n not in tensors]
            assert inputs and all(
                p is not None and p.op_type == "DequantizeLinear" for p in inputs
            ), node.name
    for dq in (n for n in model.graph.node if n.op_type == "DequantizeLinear"):
        quantizer = producers.get(dq.input[0])
        source = None if quantizer is None else producers.get(quantizer.input[0])
        if source is None or not head.match(source.name):
            continue
        readers = [n.op_type for n in model.graph.node if dq.output[0] in n.input]
        assert source.op_type == "Conv" or readers == ["Conv"] * len(readers), source.name
    assert producers[model.graph.output[0].name].op_type != "DequantizeLinear"
    provenance = json.loads(
        next(p.value for p in model.metadata_props if p.key == "vdet_quantization")
    )
    assert provenance["target"] == "cpu" and provenance["method"] == "max"
    assert provenance["quantized_ops"] == list(q.CPU_QUANTIZED_OPS)
    assert provenance["float_head"] == r"/model\.22/"
    # cpu_fusions: the head's 12 SiLUs are the float ones left (the backbone's 45 run on uint8)
    assert provenance["fused_silu"] == 12 and provenance["fused_dfl"] == 1
    assert load_model_info(demo_cpu_int8.output).names == load_model_info(DEMO).names


def test_a_model_without_the_detect_head_gets_only_its_convolutions_quantized(
    tmp_path: Path,
) -> None:
    """The demo model with its head's nodes renamed: nothing says where the output's float
    operators are (the output's producer is not an Ultralytics `/model.N/` node; taking the
    last such module would take the neck's), so only convolutions go to uint8 (every SiLU
    stays float and is fused)."""
    model = onnx.load(str(DEMO))
    for node in model.graph.node:
        node.name = node.name.replace("/model.22/", "/detect/")
    renamed = tmp_path / "renamed.onnx"
    onnx.save(model, str(renamed))
    frames = q.collect_calibration_frames(SAMPLE, load_model_info(DEMO).input_hw, 4)
    result = q.quantize_onnx_for_cpu(renamed, tmp_path / "renamed.int8.onnx", frames)
    built = onnx.load(str(result.output))
    provenance = json.loads(
        next(p.value for p in built.metadata_props if p.key == "vdet_quantization")
    )
    assert provenance["quantized_ops"] == ["Conv"] and provenance["float_head"] is None
    assert provenance["fused_silu"] == 57
    assert not [n for n in built.graph.node if n.op_type == "Sigmoid" and "act" in n.name]


def test_the_cpu_int8_model_finds_what_fp32_finds_at_rect_inputs(
    demo_cpu_int8: q.QuantizeResult,
) -> None:
    """On sample frames (not the calibration ones: every 30th), at the 384x640 rect input:
    each clear FP32 box (score >= 0.5) has an INT8 box of its class at IoU >= 0.7."""
    images = _sample_frames(6)
    with (
        Detector.open(DEMO, "onnxruntime", input_shape="rect") as fp32,
        Detector.open(demo_cpu_int8.output, "onnxruntime", input_shape="rect") as int8,
    ):
        assert int8.input_hw((1920, 1080)) == (384, 640)
        clear = found = 0
        for image in images:
            ((want, _),) = fp32.detect([image])
            ((got, _),) = int8.detect([image])
            for box, cls, score in zip(want.xyxy, want.class_ids, want.scores, strict=True):
                if score < 0.5:
                    continue
                clear += 1
                same = got.xyxy[got.class_ids == cls]
                found += bool(len(same)) and float(_iou(box, same).max()) >= 0.7
    assert clear >= 20
    assert found == clear


def _iou(box: Any, boxes: Any) -> Any:
    x1 = np.maximum(box[0], boxes[:, 0])
    y1 = np.maximum(box[1], boxes[:, 1])
    x2 = np.minimum(box[2], boxes[:, 2])
    y2 = np.minimum(box[3], boxes[:, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    return inter / (area + areas - inter)


def test_cli_target_cpu_writes_and_reports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cli.onnx"
    argv = ["quantize", str(SAMPLE), "--target", "cpu", "--frames", "4", "--output", str(out)]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["method"] == "max" and report["frames"] == 4 and out.is_file()
    assert report["quantized_convs"] > 50 and report["float_convs"]
    assert not list(tmp_path.glob(".*"))  # no temporary file left beside the output


def test_it_works_in_a_process_where_modelopt_patched_onnxruntime(tmp_path: Path) -> None:
    """ModelOpt (`vdet quantize`'s TensorRT target) patches ONNX Runtime's calibrators for the
    rest of the process, after which they refuse this model; the CPU target calibrates in a
    process of its own."""
    ort_patching = pytest.importorskip("modelopt.onnx.quantization.ort_patching")
    ort_patching.patch_ort_modules()
    frames = q.collect_calibration_frames(SAMPLE, load_model_info(DEMO).input_hw, 2)
    result = q.quantize_onnx_for_cpu(DEMO, tmp_path / "after-modelopt.onnx", frames)
    assert result.summary.quantized_convs
