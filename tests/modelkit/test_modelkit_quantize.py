"""`vdet quantize`: calibration frames, ModelOpt Q/DQ output as TensorRT expects it, bad input.

Most tests quantize a tiny YOLO-shaped conv net (64x64 input, raw [B, 10, N] head) so that each
calibration takes a second or two; one test quantizes the demo model on eight frames to check
the real graph's structure.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from vdet.cli.main import main
from vdet.core.model import load_model_info
from vdet.inference.preprocess import letterbox

pytest.importorskip("modelopt.onnx.quantization")

from vdet.modelkit import quantize as q

NAMES = "{0: 'a', 1: 'b', 2: 'c', 3: 'd', 4: 'e', 5: 'f'}"
TINY_HW = (64, 64)


def _conv(
    name: str, x: str, cin: int, cout: int, k: int, stride: int, rng: np.random.Generator
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto], str]:
    w = rng.normal(0, (2.0 / (cin * k * k)) ** 0.5, (cout, cin, k, k)).astype(np.float32)
    b = rng.normal(0, 0.1, cout).astype(np.float32)
    inits = [numpy_helper.from_array(w, f"{name}.w"), numpy_helper.from_array(b, f"{name}.b")]
    conv = helper.make_node(
        "Conv",
        [x, f"{name}.w", f"{name}.b"],
        [f"{name}.conv"],
        name=f"/{name}/conv/Conv",
        kernel_shape=[k, k],
        strides=[stride, stride],
        pads=[k // 2] * 4,
    )
    sig = helper.make_node("Sigmoid", [f"{name}.conv"], [f"{name}.sig"], name=f"/{name}/Sigmoid")
    mul = helper.make_node(
        "Mul", [f"{name}.conv", f"{name}.sig"], [f"{name}.out"], name=f"/{name}/Mul"
    )
    return [conv, sig, mul], inits, f"{name}.out"


def write_tiny_model(path: Path, hw: tuple[int, int] = TINY_HW) -> Path:
    """Conv-SiLU x2 (stride 2 each) then a 1x1 conv to 4 + 6 rows: output [B, 10, H*W/16]."""
    rng = np.random.default_rng(0)
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    x = "images"
    for name, cin, cout in (("model.0", 3, 16), ("model.1", 16, 32)):
        n, i, x = _conv(name, x, cin, cout, 3, 2, rng)
        nodes += n
        inits += i
    w = rng.normal(0, 0.2, (10, 32, 1, 1)).astype(np.float32)
    # Reshape [0, 10, -1]: keep the batch, 4 + 6 rows, anchors last.
    inits += [
        numpy_helper.from_array(w, "head.w"),
        numpy_helper.from_array(np.array([0, 10, -1], np.int64), "shape"),
    ]
    nodes += [
        helper.make_node("Conv", [x, "head.w"], ["head"], name="/model.2/Conv"),
        helper.make_node("Reshape", ["head", "shape"], ["output0"], name="/model.2/Reshape"),
    ]
    h, w_ = hw
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, h, w_])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, ["batch", 10, None])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    for key, value in {
        "names": NAMES,
        "imgsz": f"[{h}, {w_}]",
        "stride": "32",
        "task": "detect",
    }.items():
        model.metadata_props.add(key=key, value=value)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def write_images(folder: Path, count: int, size_wh: tuple[int, int] = (96, 72)) -> list[Path]:
    """Noise with a few bright boxes: enough range for every activation to calibrate."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    paths = []
    for i in range(count):
        image = rng.integers(0, 120, (size_wh[1], size_wh[0], 3), dtype=np.uint8)
        for _ in range(3):
            x, y = rng.integers(0, size_wh[0] - 20), rng.integers(0, size_wh[1] - 20)
            image[y : y + 16, x : x + 16] = rng.integers(100, 256, 3, dtype=np.uint8)
        path = folder / f"frame_{i:03d}.png"
        cv2.imwrite(str(path), image)
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("quant")
    model = write_tiny_model(root / "tiny.onnx")
    images = write_images(root / "calib", 8)
    frames = q.collect_calibration_frames(root / "calib", TINY_HW, 8)
    out = root / "tiny.int8.onnx"
    result = q.quantize_onnx(model, out, frames, "entropy")
    return {
        "root": root,
        "model": model,
        "images": images,
        "frames": frames,
        "out": out,
        "result": result,
    }


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".") or ".tmp" in p.name)


# --- frames ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("available", "count", "expected"),
    [
        (0, 3, []),
        (2, 5, [0, 1]),
        (5, 5, [0, 1, 2, 3, 4]),
        (10, 4, [0, 2, 5, 7]),
        (120, 3, [0, 40, 80]),
    ],
)
def test_evenly_spaced(available: int, count: int, expected: list[int]) -> None:
    assert q.evenly_spaced(available, count) == expected


def test_folder_frames_are_the_serving_letterbox(tiny: dict[str, Any]) -> None:
    frames = tiny["frames"]
    assert frames.batch.shape == (8, 3, *TINY_HW) and frames.picked == tuple(range(8))
    expected, _ = letterbox(cv2.imread(str(tiny["images"][3])), TINY_HW)
    assert np.array_equal(frames.batch[3], expected)


def test_folder_sampling_is_even_or_every_k(tiny: dict[str, Any]) -> None:
    calib = tiny["root"] / "calib"
    assert q.collect_calibration_frames(calib, TINY_HW, 3).picked == (0, 2, 5)
    assert q.collect_calibration_frames(calib, TINY_HW, 3, every=3).picked == (0, 3, 6)


def test_video_frames_sampled_evenly(h264_clip: Path) -> None:
    frames = q.collect_calibration_frames(h264_clip, TINY_HW, 4)
    assert frames.picked == (0, 30, 60, 90) and frames.available == 120
    every = q.collect_calibration_frames(h264_clip, TINY_HW, 3, every=7)
    assert every.picked == (0, 7, 14)


def test_rtsp_camera_every_kth_frame(rtsp_server_factory: Any, h264_clip: Path) -> None:
    """A live stream has no known length: every k-th frame from the start until enough."""
    server = rtsp_server_factory(h264_clip)
    frames = q.collect_calibration_frames(server.url, TINY_HW, 5, every=3)
    assert frames.picked == (0, 3, 6, 9, 12) and frames.available is None
    assert frames.batch.shape == (5, 3, *TINY_HW) and frames.source == server.url


def test_video_with_fewer_frames_than_asked(h264_clip: Path) -> None:
    with pytest.raises(q.QuantizeError, match=r"only 120 calibration frames available, 200 asked"):
        q.collect_calibration_frames(h264_clip, TINY_HW, 200)
    assert len(q.collect_calibration_frames(h264_clip, TINY_HW, 200, allow_fewer=True)) == 120


# --- the quantized model --------------------------------------------------------------------


def test_qdq_structure_is_what_tensorrt_expects(tiny: dict[str, Any]) -> None:
    model = onnx.load(str(tiny["out"]))
    inits = {t.name: t for t in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    qdq = [n for n in model.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    assert qdq
    for node in qdq:
        zero = inits[node.input[2]]
        assert zero.data_type == TensorProto.INT8
        assert not numpy_helper.to_array(zero).any()
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    assert [c.name for c in convs] == [c.name for c in convs if c.input[1] in producers]
    for conv in convs:
        wdq = producers[conv.input[1]]
        assert wdq.op_type == "DequantizeLinear"
        weights = inits[wdq.input[0]]
        assert weights.data_type == TensorProto.INT8
        axis = {a.name: a.i for a in wdq.attribute}.get("axis", 1)
        scale = numpy_helper.to_array(inits[wdq.input[1]])
        assert axis == 0 and scale.shape == (weights.dims[0],)
        adq = producers[conv.input[0]]
        assert adq.op_type == "DequantizeLinear"
        assert producers[adq.input[0]].op_type == "QuantizeLinear"
        assert numpy_helper.to_array(inits[adq.input[1]]).size == 1
    assert q.check_qdq_model(model).quantized_convs == tuple(c.name for c in convs)


def test_every_scale_is_finite_and_positive(tiny: dict[str, Any]) -> None:
    scales = q.scale_summary(onnx.load(str(tiny["out"])))
    values = np.concatenate([np.asarray(v) for v in scales.values()])
    assert len(scales) >= 6 and np.isfinite(values).all() and (values > 0).all()


def test_calibration_is_deterministic(tiny: dict[str, Any], tmp_path: Path) -> None:
    again = q.quantize_onnx(tiny["model"], tmp_path / "again.onnx", tiny["frames"], "entropy")
    assert q.scale_summary(onnx.load(str(again.output))) == q.scale_summary(
        onnx.load(str(tiny["out"]))
    )
    assert again.sha256 == tiny["result"].sha256  # byte-identical, metadata included


def test_methods_differ_and_max_covers_the_range(tiny: dict[str, Any], tmp_path: Path) -> None:
    entropy = q.activation_scales(onnx.load(str(tiny["out"])))
    out = q.quantize_onnx(tiny["model"], tmp_path / "max.onnx", tiny["frames"], "max").output
    maxed = q.activation_scales(onnx.load(str(out)))
    assert entropy.keys() == maxed.keys()
    # Max calibration never clips, so its scale is never below entropy's clipped range.
    assert all(maxed[k] >= entropy[k] * (1 - 1e-6) for k in maxed)
    # The input is in [0, 1]: its max-calibrated scale is 1 / 127 (up to the frames' maximum).
    image_scale = maxed["images"]
    assert image_scale == pytest.approx(float(tiny["frames"].batch.max()) / 127, rel=1e-5)


def test_qdq_model_runs_in_onnxruntime_close_to_fp32(tiny: dict[str, Any]) -> None:
    from vdet.inference.backends.onnxruntime import OnnxRuntimeBackend

    batch = tiny["frames"].batch[:4]
    with OnnxRuntimeBackend(tiny["model"], threads=1) as fp32_backend:
        reference = fp32_backend.infer(batch)
    with OnnxRuntimeBackend(tiny["out"], threads=1) as int8_backend:
        assert int8_backend.info.names == ("a", "b", "c", "d", "e", "f")  # metadata kept
        quantized = int8_backend.infer(batch)
    assert quantized.shape == reference.shape == (4, 10, 256)
    spread = float(reference.max() - reference.min())
    assert float(np.abs(quantized - reference).max()) < 0.1 * spread


def test_provenance_in_metadata(tiny: dict[str, Any]) -> None:
    props = {p.key: p.value for p in onnx.load(str(tiny["out"])).metadata_props}
    record = json.loads(props["vdet_quantization"])
    assert record["method"] == "entropy" and record["frames"] == 8
    assert record["tool"] == "nvidia-modelopt"
    assert props["names"] == NAMES


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        ("zero_point", "zero point is not 0"),
        ("zero_scale", "finite and positive"),
        ("weight_axis", "per output channel on axis 0"),
        ("no_zero_point", "no zero point"),
    ],
)
def test_check_rejects_what_tensorrt_would_not_take(
    tiny: dict[str, Any], breakage: str, message: str
) -> None:
    model = onnx.load(str(tiny["out"]))
    inits = {t.name: t for t in model.graph.initializer}
    weight_dq = next(
        n
        for n in model.graph.node
        if n.op_type == "DequantizeLinear"
        and n.input[0] in inits
        and numpy_helper.to_array(inits[n.input[1]]).size > 1
    )
    if breakage == "zero_point":
        zp = inits[weight_dq.input[2]]
        zp.CopyFrom(numpy_helper.from_array(np.ones(zp.dims, np.int8), zp.name))
    elif breakage == "zero_scale":
        scale = inits[weight_dq.input[1]]
        scale.CopyFrom(numpy_helper.from_array(np.zeros(scale.dims, np.float32), scale.name))
    elif breakage == "weight_axis":
        for attribute in weight_dq.attribute:
            if attribute.name == "axis":
                attribute.i = 1
    else:
        del weight_dq.input[2]
    with pytest.raises(q.QuantizeError, match=message):
        q.check_qdq_model(model)


def test_demo_model_structure(demo_int8: q.QuantizeResult) -> None:
    """The real YOLOv8n graph: every conv but the excluded DFL one is int8, per channel."""
    model = onnx.load(str(demo_int8.output))
    convs = [n.name for n in model.graph.node if n.op_type == "Conv"]
    excluded = [c for c in convs if any(re.match(p, c) for p in q.DEFAULT_NODES_TO_EXCLUDE)]
    assert excluded and set(demo_int8.summary.float_convs) == set(excluded)
    assert len(demo_int8.summary.quantized_convs) == len(convs) - len(excluded)
    assert load_model_info(demo_int8.output).input_hw == (640, 640)


# --- bad input, through the CLI -------------------------------------------------------------


def _quantize_cli(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> tuple[int, dict[str, Any] | None, str]:
    rc = main(["quantize", *args])
    out, err = capsys.readouterr()
    last = out.strip().splitlines()[-1] if out.strip() else ""
    return rc, (json.loads(last) if rc == 0 else None), err


def test_cli_writes_a_model_and_reports_it(
    tiny: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cli.onnx"
    rc, report, _ = _quantize_cli(
        [
            str(tiny["root"] / "calib"),
            "--model",
            str(tiny["model"]),
            "--output",
            str(out),
            "--frames",
            "6",
            "--method",
            "max",
            "--save-frames",
            str(tmp_path / "frames.npy"),
        ],
        capsys,
    )
    assert rc == 0 and report is not None
    assert report["frames"] == 6 and report["method"] == "max" and out.is_file()
    assert np.load(tmp_path / "frames.npy").shape == (6, 3, *TINY_HW)
    assert _leftovers(tmp_path) == []


def _bad_inputs(root: Path, tiny: dict[str, Any]) -> dict[str, tuple[list[str], str]]:
    (root / "empty").mkdir()
    broken = root / "broken"
    write_images(broken, 3)
    (broken / "frame_001.png").write_bytes(b"not a png at all")
    np.save(root / "small.npy", np.zeros((4, 3, 32, 32), np.float32))
    model = ["--model", str(tiny["model"])]
    return {
        "empty folder": ([str(root / "empty"), *model], "no images"),
        "unreadable file": ([str(broken), *model, "--frames", "3"], "cannot read image"),
        "fewer frames": (
            [str(tiny["root"] / "calib"), *model, "--frames", "20"],
            "only 8 calibration frames available, 20 asked",
        ),
        "input size mismatch": (
            [str(root / "small.npy"), *model, "--frames", "4"],
            "are 32x32 \\(HxW\\) but .* takes 64x64",
        ),
        "missing source": ([str(root / "nope.mp4"), *model], "does not exist"),
        "not a video": ([str(tiny["model"]), *model], "cannot read video"),
        "unknown exclusion": (
            [str(tiny["root"] / "calib"), *model, "--frames", "2", "--exclude", "/model\\.99/"],
            "matches no node",
        ),
        "already quantized": (
            [str(tiny["root"] / "calib"), "--model", str(tiny["out"]), "--frames", "2"],
            "already has Q/DQ nodes",
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "empty folder",
        "unreadable file",
        "fewer frames",
        "input size mismatch",
        "missing source",
        "not a video",
        "unknown exclusion",
        "already quantized",
    ],
)
def test_cli_bad_input_exits_2_and_writes_nothing(
    case: str, tiny: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    args, message = _bad_inputs(inputs, tiny)[case]
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    rc, _, err = _quantize_cli([*args, "--output", str(out_dir / "model.onnx")], capsys)
    assert rc == 2
    assert re.search(message, err), err
    assert err.startswith("vdet quantize: ") and err.count("\n") == 1
    assert list(out_dir.iterdir()) == []


def test_allow_fewer_accepts_what_there_is(
    tiny: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, report, _ = _quantize_cli(
        [
            str(tiny["root"] / "calib"),
            "--model",
            str(tiny["model"]),
            "--frames",
            "20",
            "--allow-fewer",
            "--output",
            str(tmp_path / "m.onnx"),
        ],
        capsys,
    )
    assert rc == 0 and report is not None and report["frames"] == 8


def test_failure_after_calibration_leaves_no_partial_file(
    tiny: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "model.onnx"
    out.write_bytes(b"previous model")

    def fail_half_way(model: onnx.ModelProto, path: str) -> None:
        Path(path).write_bytes(b"half a model")
        raise OSError("disk full")

    monkeypatch.setattr(q.onnx, "save", fail_half_way)
    with pytest.raises(OSError, match="disk full"):
        q.quantize_onnx(tiny["model"], out, tiny["frames"], "max")
    assert out.read_bytes() == b"previous model"
    assert _leftovers(tmp_path) == []


def test_fp16_copy_keeps_io_types_and_metadata(tiny: dict[str, Any], tmp_path: Path) -> None:
    from vdet.inference.backends.onnxruntime import OnnxRuntimeBackend

    half = q.convert_fp16(tiny["model"], tmp_path / "half.onnx")
    proto = onnx.load(str(half))
    assert proto.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    assert any(t.data_type == TensorProto.FLOAT16 for t in proto.graph.initializer)
    batch = tiny["frames"].batch[:2]
    with OnnxRuntimeBackend(tiny["model"]) as a, OnnxRuntimeBackend(half) as b:
        assert b.info.names == a.info.names
        np.testing.assert_allclose(b.infer(batch), a.infer(batch), rtol=0.02, atol=0.05)
