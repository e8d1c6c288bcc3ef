"""`vdet.modelkit.cpu_fusions`: the SiLU and DFL rewrites for ONNX Runtime's CPU provider change
what runs, never what comes out. Checked on the demo model after ONNX Runtime's quantization
pre-pass (what `vdet quantize --target cpu` hands them, in FP32), run by ONNX Runtime (outputs
within 1e-5 of the model as exported, at the rect and the square input), on the bundled INT8
build, and on small graphs that only look like the patterns (left alone)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from vdet.core.assets import asset_path, demo_cpu_int8_path
from vdet.modelkit.cpu_fusions import CpuFusions, fuse_for_onnxruntime_cpu

DEMO = asset_path("demo.onnx")


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    (out,) = session.run(None, {session.get_inputs()[0].name: x})
    return np.asarray(out)


@pytest.fixture(scope="module")
def prepared_demo(tmp_path_factory: pytest.TempPathFactory) -> onnx.ModelProto:
    """The demo model after the pre-pass the CPU target runs before quantizing (its shapes
    folded into constants, as the rewrites then see them)."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    out = tmp_path_factory.mktemp("prepared") / "demo.prepared.onnx"
    quant_pre_process(str(DEMO), str(out), skip_symbolic_shape=True)
    return onnx.load(str(out))


def test_a_shape_computed_at_run_time_keeps_the_dfl_as_it_is() -> None:
    """As exported, the DFL's Reshape takes a shape computed from the input's: it might copy a
    dimension that the new layout moves, so that DFL is left alone (the SiLUs are not)."""
    assert fuse_for_onnxruntime_cpu(onnx.load(str(DEMO)))[1] == CpuFusions(silu=57, dfl=0)


@pytest.mark.parametrize("hw", [(384, 640), (640, 640)])
def test_the_demo_model_computes_the_same_after_fusing(
    prepared_demo: onnx.ModelProto, hw: tuple[int, int]
) -> None:
    model = prepared_demo
    fused, done = fuse_for_onnxruntime_cpu(model)
    assert done == CpuFusions(silu=57, dfl=1)
    onnx.checker.check_model(fused)
    ops = [n.op_type for n in fused.graph.node]
    assert ops.count("QuickGelu") == 57 and "Sigmoid" in ops  # the one Sigmoid without a Mul
    assert "MatMul" in ops and "model.22.dfl.conv.weight" not in {
        t.name for t in fused.graph.initializer
    }
    x = np.random.default_rng(0).random((1, 3, *hw), dtype=np.float32)
    expected, got = _run(model, x), _run(fused, x)
    assert got.shape == expected.shape == (1, 10, hw[0] * hw[1] // 64 * 21 // 16)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5 * np.abs(expected).max())
    assert fuse_for_onnxruntime_cpu(fused)[1] == CpuFusions(silu=0, dfl=0)  # nothing left


def test_the_bundled_cpu_int8_build_is_fused() -> None:
    model = onnx.load(str(demo_cpu_int8_path()))
    provenance = json.loads(
        next(p.value for p in model.metadata_props if p.key == "vdet_quantization")
    )
    # The backbone's and neck's 45 SiLUs run on uint8 (vdet.modelkit.quantize.CPU_QUANTIZED_OPS);
    # the Detect head's 12 are the float ones fused.
    assert provenance["fused_silu"] == 12 and provenance["fused_dfl"] == 1
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("QuickGelu") == 12 and "Softmax" in ops


def _graph(nodes: list[onnx.NodeProto], initializers: list[onnx.TensorProto]) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "g", [x], [y], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_look_alikes_are_left_alone() -> None:
    shape = numpy_helper.from_array(np.array([0, 4, 16, -1], np.int64), "shape")
    flat = numpy_helper.from_array(np.array([0, 4, -1], np.int64), "flat")
    copies_a_dim = numpy_helper.from_array(np.array([0, 0, -1], np.int64), "flat")
    weights = np.arange(16, dtype=np.float32).reshape(1, 16, 1, 1)
    cases = [
        ("arange", weights, flat),
        ("not arange", weights[:, ::-1].copy(), flat),
        ("reshape copies dim 1", weights, copies_a_dim),
    ]
    for name, bins, after in cases:
        nodes = [
            helper.make_node("Reshape", ["x", "shape"], ["r"]),
            helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3]),
            helper.make_node("Softmax", ["t"], ["s"], axis=1),
            helper.make_node("Conv", ["s", "w"], ["c"]),
            helper.make_node("Reshape", ["c", "flat"], ["d"]),
            # a sigmoid read twice: not a SiLU
            helper.make_node("Sigmoid", ["d"], ["g"]),
            helper.make_node("Mul", ["d", "g"], ["m"]),
            helper.make_node("Add", ["m", "g"], ["y"]),
        ]
        model = _graph(nodes, [shape, after, numpy_helper.from_array(bins, "w")])
        fused, done = fuse_for_onnxruntime_cpu(model)
        x = np.random.default_rng(1).random((1, 64, 8), dtype=np.float32)
        if name == "arange":
            assert done == CpuFusions(silu=0, dfl=1)
        else:
            assert done == CpuFusions(silu=0, dfl=0)
            assert fused.graph == model.graph
        np.testing.assert_allclose(_run(fused, x), _run(model, x), rtol=1e-6, atol=1e-6)
