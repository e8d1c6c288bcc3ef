"""TensorRT itself: engines built by vdet.tensorrt.build, run by the tensorrt backend.

(This folder is not called tests/tensorrt/: with tests/ on sys.path, as this project's
conftest puts it, that folder would be importable as a namespace package `tensorrt` and
libraries probing for TensorRT, ModelOpt among them, would take it for the real one.)

Marked `tensorrt` and skipped where `tensorrt` does not import or no GPU is visible (this
project's development machine has neither; docs/tensorrt.md says what has and has not run).
Nothing here imitates TensorRT: every test builds and runs real engines.

- the demo model's engine against ONNX Runtime (fp32 and fp16), dynamic batch, reuse;
- a mismatching manifest refused at load; a parser failure reported by node name;
- the decode + NMS plugin (libvdet_plugins.so) inside TensorRT against the CPU reference, on a
  graph whose "network" is a reshape, so the plugin sees exactly the raw head we wrote;
- an engine captured into a CUDA graph and replayed gives what eager execution gives;
- plugins/tests/plugin_harness.cpp built with CMake and run on the GPU (`gpu` too).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from support.tools import REPO

from vdet.cuda.runtime import cuda_call, gpu_count, runtime
from vdet.inference.postprocess import PostprocessParams, decode_and_nms, decode_and_nms_image
from vdet.tensorrt.build import BuildError, BuildOptions, build_cached, tensorrt_installed
from vdet.tensorrt.cache import OptimizationProfile, manifest_path
from vdet.tensorrt.surgery import DecodeNmsAttributes

pytestmark = pytest.mark.tensorrt

if not tensorrt_installed():  # a namespace package called tensorrt is not TensorRT
    pytest.skip("TensorRT's Python package is not installed", allow_module_level=True)
trt = pytest.importorskip("tensorrt")
if gpu_count() == 0:
    pytest.skip("TensorRT is installed but no GPU is visible", allow_module_level=True)

from vdet.inference.backends.onnxruntime import OnnxRuntimeBackend  # noqa: E402
from vdet.inference.backends.tensorrt import TensorRTBackend  # noqa: E402

ROOT = REPO
DEMO = ROOT / "service" / "vdet" / "assets" / "demo.onnx"
TENSORRT_ROOT_ENV = "TensorRT_ROOT"  # as plugins/CMakeLists.txt reads it


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("engines")


def _frames(n: int, hw: tuple[int, int] = (640, 640), seed: int = 0) -> np.ndarray:
    """Letterbox-like inputs: flat grey with a few bright squares, so the head has content."""
    rng = np.random.default_rng(seed)
    x = np.full((n, 3, *hw), 114 / 255, np.float32)
    for i in range(n):
        for _ in range(4):
            y0, x0 = rng.integers(0, hw[0] - 120), rng.integers(0, hw[1] - 120)
            size = int(rng.integers(40, 120))
            x[i, :, y0 : y0 + size, x0 : x0 + size] = rng.random((3, 1, 1), dtype=np.float32)
    return x


@pytest.fixture(scope="module")
def fp32_plan(cache_dir: Path) -> Path:
    options = BuildOptions(precision="fp32", profile=OptimizationProfile(1, 2, 4))
    first = build_cached(DEMO, options, cache_dir)
    assert first.built
    again = build_cached(DEMO, options, cache_dir)
    assert not again.built and again.plan == first.plan
    return first.plan


def test_demo_engine_matches_onnxruntime(fp32_plan: Path) -> None:
    x = _frames(3)  # batch 3 within the 1..4 profile
    with OnnxRuntimeBackend(DEMO) as ort_backend, TensorRTBackend(fp32_plan) as engine:
        assert engine.info.names == ort_backend.info.names
        assert engine.max_batch == 4 and engine.precision == "fp32" and not engine.end_to_end
        expected = ort_backend.infer(x)
        got = engine.infer(x)
        big = engine.infer(np.concatenate([x, x]))  # 6 > max batch: split in two runs
    assert got.shape == expected.shape == (3, 10, 8400)
    # TF32 is allowed in fp32 builds: boxes within a fraction of a pixel, scores within 1e-3.
    np.testing.assert_allclose(got[:, :4], expected[:, :4], atol=0.25, rtol=1e-3)
    np.testing.assert_allclose(got[:, 4:], expected[:, 4:], atol=1e-3)
    np.testing.assert_allclose(big[3:], got, atol=1e-5)
    params = PostprocessParams()
    for a, b in zip(decode_and_nms(got, params), decode_and_nms(expected, params), strict=True):
        assert len(a.scores) == len(b.scores)
        np.testing.assert_array_equal(a.class_ids, b.class_ids)


def test_fp16_engine_is_close_to_onnxruntime(cache_dir: Path) -> None:
    options = BuildOptions(precision="fp16", profile=OptimizationProfile(1, 1, 2))
    cached = build_cached(DEMO, options, cache_dir)
    assert cached.manifest.key.precision == "fp16"
    major = int(trt.__version__.split(".")[0])
    assert cached.manifest.build["fp16_flag"] == (major < 11)
    assert cached.manifest.build["converted_fp16"] == (major >= 11)
    x = _frames(2, seed=1)
    with OnnxRuntimeBackend(DEMO) as ort_backend, TensorRTBackend(cached.plan) as engine:
        expected, got = ort_backend.infer(x), engine.infer(x)
    np.testing.assert_allclose(got[:, :4], expected[:, :4], atol=2.0, rtol=1e-2)
    np.testing.assert_allclose(got[:, 4:], expected[:, 4:], atol=2e-2)


def test_plan_from_another_tensorrt_is_refused(fp32_plan: Path, tmp_path: Path) -> None:
    from vdet.tensorrt.cache import EngineMismatchError

    copy = tmp_path / fp32_plan.name
    shutil.copy(fp32_plan, copy)
    manifest = json.loads(manifest_path(fp32_plan).read_text())
    manifest["key"]["tensorrt_version"] = "9.9.9"
    manifest_path(copy).write_text(json.dumps(manifest))
    with pytest.raises(EngineMismatchError, match=r"built with TensorRT 9\.9\.9"):
        TensorRTBackend(copy)


def test_parser_failure_names_the_node(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [
            helper.make_node("Reshape", ["images", "shape"], ["flat"], name="to_head"),
            helper.make_node("NoSuchOp", ["flat"], ["output0"], name="the_bad_node"),
        ],
        "bad",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, 6, 32])],
        initializer=[helper.make_tensor("shape", TensorProto.INT64, [3], [-1, 6, 32])],
    )
    path = tmp_path / "bad.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    with pytest.raises(BuildError, match="the_bad_node") as failure:
        build_cached(path, BuildOptions(), tmp_path / "cache")
    assert "NoSuchOp" in str(failure.value)


# ---- the plugin inside TensorRT -----------------------------------------------------------------


def _tensorrt_root() -> Path | None:
    configured = os.environ.get(TENSORRT_ROOT_ENV)
    candidates = [Path(configured)] if configured else []
    candidates += [Path("/usr"), Path("/usr/local/tensorrt")]
    for root in candidates:
        for include in ("include", "include/x86_64-linux-gnu", "include/aarch64-linux-gnu"):
            if (root / include / "NvInferRuntime.h").is_file():
                return root
    return None


@pytest.fixture(scope="module")
def plugin_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """plugins/ built with CMake against this machine's TensorRT (or $PLUGIN_DIR's library)."""
    if (
        os.environ.get("PLUGIN_DIR")
        and (Path(os.environ["PLUGIN_DIR"]) / "libvdet_plugins.so").is_file()
    ):
        return Path(os.environ["PLUGIN_DIR"])
    root = _tensorrt_root()
    if shutil.which("cmake") is None or shutil.which("nvcc") is None or root is None:
        pytest.skip("building the plugin needs cmake, nvcc and TensorRT headers")
    build = tmp_path_factory.mktemp("plugin-build")
    for command in (
        ["cmake", "-S", str(ROOT / "plugins"), "-B", str(build), f"-DTensorRT_ROOT={root}"],
        ["cmake", "--build", str(build), "-j"],
    ):
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stdout + result.stderr
    return build


def _reshape_head_model(path: Path, nc: int, side: int) -> tuple[Path, int]:
    """A 'detector' whose raw head is its input reshaped: the plugin sees exactly our values."""
    rows = 4 + nc
    anchors = 3 * side * side // rows
    assert rows * anchors == 3 * side * side
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["images", "shape"], ["output0"])],
        "reshape_head",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, side, side])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, ["batch", rows, anchors])],
        initializer=[helper.make_tensor("shape", TensorProto.INT64, [3], [-1, rows, anchors])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path, anchors


def _random_head(rng: np.random.Generator, batch: int, nc: int, anchors: int) -> np.ndarray:
    centres = rng.uniform(40, 600, size=(batch, 5, 2))
    pick = rng.integers(0, 5, size=(batch, anchors))
    cxcy = np.take_along_axis(centres, pick[..., None], axis=1)
    cxcy = cxcy + rng.normal(0, 6, (batch, anchors, 2))
    wh = rng.uniform(20, 90, size=(batch, anchors, 2))
    scores = rng.permutation(batch * nc * anchors).reshape(batch, anchors, nc)
    scores = 0.001 + 0.998 * scores / scores.max()
    head = np.concatenate([cxcy, wh, scores], axis=2).transpose(0, 2, 1)
    return np.ascontiguousarray(head, dtype=np.float32)


@pytest.mark.parametrize("agnostic", [False, True])
def test_plugin_in_tensorrt_matches_the_cpu_reference(
    plugin_build: Path, tmp_path: Path, agnostic: bool
) -> None:
    nc, side = 5, 24
    model, anchors = _reshape_head_model(tmp_path / "head.onnx", nc, side)
    attrs = DecodeNmsAttributes(
        score_threshold=0.3, iou_threshold=0.5, top_k=128, max_det=50, class_agnostic=agnostic
    )
    options = BuildOptions(
        profile=OptimizationProfile(1, 2, 4),
        plugin_nms=attrs,
        plugin_library=plugin_build / "libvdet_plugins.so",
    )
    cached = build_cached(model, options, tmp_path / "cache")
    assert cached.manifest.key.plugin_sha256 is not None
    raw = _random_head(np.random.default_rng(3), 3, nc, anchors)
    with TensorRTBackend(cached.plan) as engine:
        assert engine.end_to_end
        dets, counts = engine.infer_end_to_end(raw.reshape(3, 3, side, side))
    params = PostprocessParams(
        conf_threshold=0.3, iou_threshold=0.5, top_k=128, max_det=50, class_agnostic=agnostic
    )
    for b in range(3):
        expected, _ = decode_and_nms_image(raw[b], params)
        n = len(expected.scores)
        assert counts[b] == n and n > 0
        np.testing.assert_allclose(dets[b, :n, :4], expected.xyxy, atol=1e-4, rtol=0)
        np.testing.assert_array_equal(dets[b, :n, 4], expected.scores)
        np.testing.assert_array_equal(dets[b, :n, 5], expected.class_ids.astype(np.float32))
        assert not dets[b, n:].any()


def test_demo_end_to_end_engine_agrees_with_its_raw_head(
    plugin_build: Path, fp32_plan: Path, cache_dir: Path
) -> None:
    options = BuildOptions(
        precision="fp32",
        profile=OptimizationProfile(1, 2, 4),
        plugin_nms=DecodeNmsAttributes(),
        plugin_library=plugin_build / "libvdet_plugins.so",
    )
    cached = build_cached(DEMO, options, cache_dir)
    x = _frames(2, seed=4)
    with TensorRTBackend(fp32_plan) as raw_engine, TensorRTBackend(cached.plan) as e2e:
        raw = raw_engine.infer(x)
        dets, counts = e2e.infer_end_to_end(x)
    for b, expected in enumerate(decode_and_nms(raw, PostprocessParams())):
        # Two engines, two sets of tactics: the same objects, boxes within a pixel.
        assert abs(int(counts[b]) - len(expected.scores)) <= 1
        n = min(int(counts[b]), len(expected.scores))
        np.testing.assert_allclose(dets[b, :n, :4], expected.xyxy[:n], atol=1.0)


# ---- CUDA graph replay --------------------------------------------------------------------------


def _input_name(engine: Any) -> str:
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    (name,) = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
    return str(name)


def _device_buffers(
    engine: Any, context: Any, batch: int, input_hw: tuple[int, int]
) -> dict[str, Any]:
    rt = runtime()
    name_in = _input_name(engine)
    assert context.set_input_shape(name_in, (batch, 3, *input_hw))
    buffers = {}
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        shape = tuple(context.get_tensor_shape(name))
        host = np.zeros(shape, dtype=trt.nptype(engine.get_tensor_dtype(name)))
        ptr = int(cuda_call(rt.cudaMalloc(host.nbytes), "cudaMalloc"))
        assert context.set_tensor_address(name, ptr)
        buffers[name] = (ptr, host)
    return buffers


def _replay_equals_eager(plan: Path, x1: np.ndarray, x2: np.ndarray, plugin: Path | None) -> None:
    rt = runtime()
    if plugin is not None:
        from vdet.tensorrt.plugin_library import load_into_tensorrt

        load_into_tensorrt(trt, plugin)
    logger = trt.Logger(trt.Logger.WARNING)
    engine = trt.Runtime(logger).deserialize_cuda_engine(plan.read_bytes())
    context = engine.create_execution_context()
    stream = cuda_call(rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking), "cudaStreamCreate")
    buffers = _device_buffers(engine, context, len(x1), x1.shape[2:])
    name_in = _input_name(engine)
    h2d = rt.cudaMemcpyKind.cudaMemcpyHostToDevice
    d2h = rt.cudaMemcpyKind.cudaMemcpyDeviceToHost

    def upload(x: np.ndarray) -> None:
        x = np.ascontiguousarray(x)
        cuda_call(
            rt.cudaMemcpyAsync(buffers[name_in][0], x.ctypes.data, x.nbytes, h2d, stream), "h2d"
        )

    def download() -> dict[str, np.ndarray]:
        out = {}
        for name, (ptr, host) in buffers.items():
            if name == name_in:
                continue
            copy = np.empty_like(host)
            cuda_call(rt.cudaMemcpyAsync(copy.ctypes.data, ptr, copy.nbytes, d2h, stream), "d2h")
            out[name] = copy
        cuda_call(rt.cudaStreamSynchronize(stream), "sync")
        return out

    eager = {}
    for key, x in (("x1", x1), ("x2", x2)):
        upload(x)
        assert context.execute_async_v3(int(stream))  # also flushes deferred updates before capture
        eager[key] = download()

    mode = rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
    cuda_call(rt.cudaStreamBeginCapture(stream, mode), "cudaStreamBeginCapture")
    assert context.execute_async_v3(int(stream))
    graph = cuda_call(rt.cudaStreamEndCapture(stream), "cudaStreamEndCapture")
    graph_exec = cuda_call(rt.cudaGraphInstantiate(graph, 0), "cudaGraphInstantiate")
    for key, x in (("x1", x1), ("x2", x2), ("x1", x1)):
        upload(x)
        cuda_call(rt.cudaGraphLaunch(graph_exec, stream), "cudaGraphLaunch")
        replayed = download()
        for name, value in replayed.items():
            np.testing.assert_array_equal(value, eager[key][name])
    cuda_call(rt.cudaGraphExecDestroy(graph_exec), "cudaGraphExecDestroy")
    cuda_call(rt.cudaGraphDestroy(graph), "cudaGraphDestroy")
    for ptr, _ in buffers.values():
        cuda_call(rt.cudaFree(ptr), "cudaFree")
    cuda_call(rt.cudaStreamDestroy(stream), "cudaStreamDestroy")


def test_graph_replay_equals_eager(fp32_plan: Path) -> None:
    _replay_equals_eager(fp32_plan, _frames(2, seed=5), _frames(2, seed=6), plugin=None)


def test_plugin_graph_replay_equals_eager(plugin_build: Path, tmp_path: Path) -> None:
    nc, side = 5, 24
    model, anchors = _reshape_head_model(tmp_path / "head.onnx", nc, side)
    library = plugin_build / "libvdet_plugins.so"
    options = BuildOptions(
        profile=OptimizationProfile(1, 2, 2),
        plugin_nms=DecodeNmsAttributes(),
        plugin_library=library,
    )
    cached = build_cached(model, options, tmp_path / "cache")
    rng = np.random.default_rng(8)
    x1 = _random_head(rng, 2, nc, anchors).reshape(2, 3, side, side)
    x2 = _random_head(rng, 2, nc, anchors).reshape(2, 3, side, side)
    _replay_equals_eager(cached.plan, x1, x2, plugin=library)


# ---- the C++ harness on the GPU -----------------------------------------------------------------


@pytest.mark.gpu
def test_plugin_harness_on_the_gpu(plugin_build: Path, tmp_path: Path) -> None:
    harness = plugin_build / "vdet_plugin_harness"
    if not harness.is_file():
        pytest.skip("the harness was not built (VDET_BUILD_HARNESS=OFF or $PLUGIN_DIR given)")
    result = subprocess.run([str(harness)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    raw = _random_head(np.random.default_rng(9), 2, 5, 400)
    raw.tofile(tmp_path / "raw.f32")
    command = [
        str(harness), "--raw", str(tmp_path / "raw.f32"), "--shape", "2,9,400",
        "--out", str(tmp_path / "dets.f32"), "--count", str(tmp_path / "count.i32"),
    ]  # fmt: skip
    assert subprocess.run(command, capture_output=True, text=True, timeout=300).returncode == 0
    dets = np.fromfile(tmp_path / "dets.f32", np.float32).reshape(2, 300, 6)
    counts = np.fromfile(tmp_path / "count.i32", np.int32)
    for b in range(2):
        expected, _ = decode_and_nms_image(raw[b], PostprocessParams())
        assert counts[b] == len(expected.scores)
        np.testing.assert_allclose(dets[b, : counts[b], :4], expected.xyxy, atol=1e-4)


def _nv12_frame(seed: int) -> Any:
    """A rendered 1080p scene as a GpuVideoFrame (NV12 on the GPU, BT.601 limited, as
    cv2's BGR -> I420 makes it) and the BGR image it came from."""
    import cv2
    import torch

    from vdet.core.types import ColourMatrix, ColourRange
    from vdet.ingest.nvdec import GpuVideoFrame
    from vdet.modelkit.dataset.synthetic import SceneConfig, render_image

    bgr = render_image(seed, SceneConfig(width=1920, height=1080)).image_bgr
    h, w = bgr.shape[:2]
    i420 = cv2.cvtColor(bgr, cv2.COLOR_BGR2YUV_I420)
    u = i420[h : h + h // 4].reshape(h // 2, w // 2)
    v = i420[h + h // 4 :].reshape(h // 2, w // 2)
    nv12 = np.concatenate((i420[:h], np.stack((u, v), axis=-1).reshape(h // 2, w)))
    frame = GpuVideoFrame(
        source_id="cam",
        index=seed,
        pts_seconds=None,
        arrival_time=0.0,
        decode_seconds=0.0,
        width=w,
        height=h,
        nv12=torch.from_numpy(np.ascontiguousarray(nv12)).cuda(),
        matrix=ColourMatrix.BT601,
        colour_range=ColourRange.LIMITED,
        stream=None,
        ready=None,
    )
    return frame, bgr


@pytest.mark.parametrize("batch", [1, 2])
def test_gpu_workers_on_the_engine_find_what_onnxruntime_finds(fp32_plan: Path, batch: int) -> None:
    """vdet serve's GPU path on TensorRT: one context per stream runner (or one batched
    runner), our kernels around the engine, all in one CUDA graph; replay against eager. The
    demo's engine has a profile over rectangular inputs, so the 1080p frames run at 384x640
    (input_shape: rect, the default), as the CPU reference does."""
    from vdet.config.gpu import GpuSettings
    from vdet.gpu.devices import GpuTuning, build_gpu_pool
    from vdet.inference.detector import Detector

    frames = [_nv12_frame(seed) for seed in range(3)]
    with TensorRTBackend(fp32_plan) as engine, Detector.open(DEMO, "onnxruntime") as reference:
        results = {}
        for graphs in (True, False):
            settings = GpuSettings(batch=batch, devices=[0])
            pool = build_gpu_pool(settings, engine, tuning=GpuTuning(cuda_graphs=graphs))
            worker = pool.devices[0]
            try:
                results[graphs] = [
                    worker.detect(f"cam{i}", frame, reference.params)[0]
                    for i, (frame, _) in enumerate(frames)
                ]
                assert engine.rect_networks and engine.network_min_hw == (320, 320)
                if batch > 1:
                    assert worker.batched_shapes == [(384, 640)]
                else:
                    assert worker.runner_shape("cam0") == (384, 640)
            finally:
                pool.close()
        expected = reference.detect([bgr for _, bgr in frames])
    for replayed, eager, (cpu, _) in zip(results[True], results[False], expected, strict=True):
        np.testing.assert_array_equal(replayed.class_ids, eager.class_ids)
        np.testing.assert_allclose(replayed.xyxy, eager.xyxy, atol=1e-3)
        assert len(replayed.xyxy) == len(cpu.xyxy) > 0
        np.testing.assert_array_equal(np.sort(replayed.class_ids), np.sort(cpu.class_ids))
