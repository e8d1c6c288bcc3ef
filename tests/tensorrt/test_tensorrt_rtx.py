"""TensorRT for RTX, for real, on a machine without a GPU: the demo model built into plans.

TensorRT for RTX (`pip install 'vdet[tensorrt-rtx]'`, module `tensorrt_rtx_bindings`) parses ONNX
and builds portable plans ahead of time for named compute capabilities with no GPU present, so
everything up to the plan runs here and in CI with the real library: parsing, typing, the build
for sm86 (an A10) in fp32, fp16 (ModelOpt AutoCast on the ONNX) and int8 (a `vdet quantize` Q/DQ
model), the manifest, the cache's refusal and rebuild on another library, version or target, and
parser errors by node. Nothing here is a stand-in for the library.

What needs a GPU it runs on (8.0, 8.6, 8.9, 12.x; not Hopper): deserializing, the engine's own
layer list, inference, the JIT runtime cache and the CUDA-graph path. Those tests are marked
`gpu` and skip with the reason; on this project's machines they have never run (no such GPU).
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from support.tools import REPO

from vdet.cli.main import main
from vdet.cuda.runtime import GpuIdentity, gpu_count, gpu_identity
from vdet.inference.backends.tensorrt import plan_refusals, runtime_cache_path, unavailable_reason
from vdet.tensorrt.build import BuildError, BuildOptions, build_cached, engine_request
from vdet.tensorrt.cache import (
    PORTABLE_GPU,
    EngineMismatchError,
    manifest_path,
    read_manifest,
    verify_plan,
)
from vdet.tensorrt.library import TENSORRT, TENSORRT_RTX, LibraryError, parse_targets
from vdet.tensorrt.surgery import DecodeNmsAttributes

if not TENSORRT_RTX.installed():
    pytest.skip(
        "TensorRT for RTX is not installed (pip install 'vdet[tensorrt-rtx]')",
        allow_module_level=True,
    )
trt = TENSORRT_RTX.load()
VERSION = str(trt.__version__)

ROOT = REPO
DEMO = ROOT / "service" / "vdet" / "assets" / "demo.onnx"
SAMPLE = ROOT / "service" / "vdet" / "assets" / "sample.mp4"
A10 = GpuIdentity("NVIDIA A10", "8.6")
H200 = GpuIdentity("NVIDIA H200", "9.0")


def _build(cache: Path, *args: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    argv = ["engine", "build", "--model", str(DEMO), "--cache-dir", str(cache), *args]
    assert main(argv) == 0, capsys.readouterr().err
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    return report


def _conv_nodes(path: Path) -> int:
    return sum(node.op_type == "Conv" for node in onnx.load(str(path)).graph.node)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("rtx-engines")


@pytest.fixture(scope="module")
def fp32(cache: Path) -> Path:
    """The demo model for an A10 (sm86), fp32, built once for the module."""
    built = build_cached(DEMO, BuildOptions(), cache, lib="tensorrt-rtx", targets=("8.6",))
    return built.plan


def test_the_demo_builds_for_sm86_without_a_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = _build(tmp_path, "--target", "sm86", capsys=capsys)
    assert report["built"] is True
    assert (report["library"], report["tensorrt"]) == ("tensorrt-rtx", VERSION)
    assert (report["gpu"], report["compute_capability"]) == (PORTABLE_GPU, "8.6")
    assert (report["precision"], report["profile"]) == ("fp32", "b1-1-8")
    plan = Path(report["plan"])
    assert plan.name == "demo.rtx-sm86.fp32.b1-1-8.plan"
    assert plan.stat().st_size > 1 << 20

    manifest = verify_plan(plan)
    key, build = manifest.key, manifest.build
    assert (key.flavour, key.tensorrt_version, key.targets) == ("tensorrt-rtx", VERSION, ("8.6",))
    assert build["library"] == "tensorrt-rtx" and build["targets"] == ["8.6"]
    assert build["strongly_typed"] is True and build["fp16_flag"] is False
    assert build["timing_cache"] is None and build["timing_cache_reused"] is False
    assert manifest.model["names"] and manifest.model["input_hw"] == [640, 640]
    # The demo's height and width are dynamic: the profile covers the GPU path's rectangular
    # inputs (down to 2:1 either way), tuned for 16:9, and the key records it.
    assert build["input_shapes"] == {
        "min": [1, 3, 320, 320],
        "opt": [1, 3, 384, 640],
        "max": [8, 3, 640, 640],
    }
    assert (key.profile.min_hw, key.profile.opt_hw) == ((320, 320), (384, 640))
    # The network as TensorRT for RTX typed it: every Conv of the ONNX, all of it in float32.
    network = build["network"]
    assert network["inputs"] == {"images": "FLOAT"} and network["outputs"] == {"output0": "FLOAT"}
    assert network["layer_types"]["CONVOLUTION"] == _conv_nodes(DEMO)
    assert "HALF" not in network["output_dtypes"] and network["output_dtypes"]["FLOAT"] > 100

    # The same request again is the same plan, not a new build.
    again = _build(tmp_path, "--target", "86", capsys=capsys)
    assert (again["built"], again["plan"]) == (False, report["plan"])

    # `vdet engine inspect` vouches for it without a GPU (the engine's own layers need one).
    assert main(["engine", "inspect", str(plan)]) == 0
    inspected = json.loads(capsys.readouterr().out)
    assert inspected["valid"] is True and inspected["manifest"]["key"]["flavour"] == "tensorrt-rtx"
    if gpu_count() == 0:
        assert "engine" not in inspected


def test_fp16_comes_from_the_onnx_and_keeps_float32_io(
    cache: Path, fp32: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = _build(cache, "--target", "sm86", "--precision", "fp16", capsys=capsys)
    plan = Path(report["plan"])
    assert plan.name == "demo.rtx-sm86.fp16.b1-1-8.plan"
    manifest = verify_plan(plan)
    build, network = manifest.build, manifest.build["network"]
    assert manifest.key.precision == "fp16" and build["converted_fp16"] is True
    # ModelOpt AutoCast converted the ONNX (kept in the cache's onnx/ folder) with float32 I/O.
    converted = Path(build["onnx"])
    assert converted.parent == cache / "onnx" and converted.name.endswith(".fp16.onnx")
    assert network["inputs"] == {"images": "FLOAT"} and network["outputs"] == {"output0": "FLOAT"}
    dtypes = network["output_dtypes"]
    assert dtypes["HALF"] > 0.9 * (dtypes["HALF"] + dtypes["FLOAT"])
    assert network["layer_types"]["CONVOLUTION"] == _conv_nodes(DEMO)
    assert plan.stat().st_size < 0.8 * fp32.stat().st_size  # half the weights' bytes


@pytest.mark.slow
def test_int8_from_a_vdet_quantize_model(cache: Path, fp32: Path, demo_int8: Any) -> None:
    """What TensorRT for RTX accepts of INT8: a Q/DQ ONNX from `vdet quantize` builds, strongly
    typed, with the quantize layers and INT8 tensors in the network it was given."""
    qdq = cache / "demo.int8.onnx"
    shutil.copyfile(demo_int8.output, qdq)
    built = build_cached(qdq, BuildOptions(), cache, lib="tensorrt-rtx", targets=("8.6",))
    manifest = built.manifest
    network = manifest.build["network"]
    assert manifest.key.precision == "int8" and built.plan.name.endswith(
        ".rtx-sm86.int8.b1-1-8.plan"
    )
    assert network["layer_types"]["QUANTIZE"] > 50 and network["layer_types"]["DEQUANTIZE"] > 50
    assert network["output_dtypes"]["INT8"] > 100
    assert network["inputs"] == {"images": "FLOAT"}
    assert built.plan.stat().st_size < fp32.stat().st_size
    with pytest.raises(BuildError, match="int8 only"):
        build_cached(
            qdq, BuildOptions(precision="fp16"), cache, lib="tensorrt-rtx", targets=("8.6",)
        )


def test_several_targets_are_one_portable_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = _build(tmp_path, "--target", "sm89,sm86", capsys=capsys)
    assert report["compute_capability"] == "8.6,8.9"
    assert Path(report["plan"]).name == "demo.rtx-sm86-89.fp32.b1-1-8.plan"
    assert read_manifest(Path(report["plan"])).key.targets == ("8.6", "8.9")


def test_a_plan_from_another_version_is_refused_and_rebuilt(
    fp32: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The manifest of a plan says another TensorRT-for-RTX release built it: `vdet engine
    build` refuses it, says which field differs, and rebuilds it with the installed one."""
    plan = tmp_path / fp32.name
    shutil.copy(fp32, plan)
    manifest = json.loads(manifest_path(fp32).read_text())
    manifest["key"]["tensorrt_version"] = "1.6.0.22"
    manifest_path(plan).write_text(json.dumps(manifest))
    with caplog.at_level(logging.WARNING, logger="vdet.tensorrt.cache"):
        rebuilt = build_cached(DEMO, BuildOptions(), tmp_path, lib="tensorrt-rtx", targets=("8.6",))
    assert rebuilt.built and rebuilt.plan == plan
    assert f"tensorrt_version: plan has '1.6.0.22', this machine wants '{VERSION}'" in caplog.text
    assert read_manifest(plan).key.tensorrt_version == VERSION


def test_a_plan_for_another_target_is_refused_and_rebuilt(
    fp32: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An sm86 plan (with its manifest) put where the sm89 plan belongs is refused and rebuilt."""
    request = engine_request(DEMO, BuildOptions(), tmp_path, lib="tensorrt-rtx", targets=("8.9",))
    slot = tmp_path / f"{request.key.slot(request.stem)}.plan"
    assert slot.name == "demo.rtx-sm89.fp32.b1-1-8.plan"
    shutil.copy(fp32, slot)
    shutil.copy(manifest_path(fp32), manifest_path(slot))
    with caplog.at_level(logging.WARNING, logger="vdet.tensorrt.cache"):
        rebuilt = build_cached(DEMO, BuildOptions(), tmp_path, lib="tensorrt-rtx", targets=("8.9",))
    assert rebuilt.built
    assert "compute_capability: plan has '8.6', this machine wants '8.9'" in caplog.text
    assert read_manifest(slot).key.targets == ("8.9",)


def test_a_plan_of_the_other_library_is_refused(fp32: Path) -> None:
    """Asked for full TensorRT 10.8 on an A10, the TensorRT-for-RTX plan is refused by name."""
    rtx = read_manifest(fp32).key
    full = engine_request(
        DEMO,
        BuildOptions(),
        fp32.parent,
        lib="tensorrt",
        tensorrt_version="10.8.0.43",
        gpu=(A10.name, A10.compute_capability),
    ).key
    with pytest.raises(EngineMismatchError) as refused:
        verify_plan(fp32, full)
    message = str(refused.value)
    assert "flavour: plan has 'tensorrt-rtx', this machine wants 'tensorrt'" in message
    assert f"tensorrt_version: plan has '{VERSION}', this machine wants '10.8.0.43'" in message
    assert "gpu_name: plan has 'portable', this machine wants 'NVIDIA A10'" in message
    # At load time: which GPUs the plan runs on, with which library (no GPU needed to decide).
    assert plan_refusals(rtx, TENSORRT_RTX, VERSION, A10) == []
    assert plan_refusals(rtx, TENSORRT_RTX, VERSION, GpuIdentity("NVIDIA L4", "8.9")) == [
        "built for compute capability 8.6, this is NVIDIA L4 (8.9)"
    ]
    assert plan_refusals(rtx, TENSORRT_RTX, "1.6.0.22", A10) == [
        f"built with TensorRT for RTX {VERSION}, this is 1.6.0.22"
    ]
    assert plan_refusals(rtx, TENSORRT, "10.8.0.43", A10) == [
        "built with TensorRT for RTX, this is TensorRT"
    ]
    # The JIT runtime cache lives beside the plan, one per GPU model (it is only valid there).
    assert runtime_cache_path(fp32, A10) == fp32.with_name(
        "demo.rtx-sm86.fp32.b1-1-8.nvidia-a10.runtime-cache"
    )


def test_what_cannot_be_built_is_refused_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    build = ["engine", "build", "--model", str(DEMO), "--cache-dir", str(tmp_path)]
    assert main([*build, "--target", "sm90"]) == 1
    assert "cannot build for compute capability 9.0" in capsys.readouterr().err
    assert main([*build, "--target", "hopper"]) == 2
    assert "not a compute capability" in capsys.readouterr().err
    with pytest.raises(BuildError, match="ships no plugin headers"):
        engine_request(
            DEMO,
            BuildOptions(plugin_nms=DecodeNmsAttributes()),
            tmp_path,
            lib="tensorrt-rtx",
            targets=("8.6",),
        )
    if gpu_count() == 0:
        assert main([*build, "--library", "tensorrt-rtx"]) == 1
        assert "pass --target" in capsys.readouterr().err
        assert unavailable_reason(TENSORRT_RTX) == "no CUDA GPU is visible"
    if not TENSORRT.installed():
        assert main([*build, "--library", "tensorrt", "--target", "sm86"]) == 1
        assert "TensorRT's Python package is not installed" in capsys.readouterr().err


@pytest.mark.skipif(gpu_count() > 0, reason="checks a machine without a GPU")
def test_without_a_gpu_auto_passes_tensorrt_rtx_over_and_says_why() -> None:
    from vdet.inference.backends import create_backend, known_backends

    assert {"tensorrt", "tensorrt-rtx"} <= set(known_backends())
    with pytest.raises(RuntimeError, match=r"tensorrt-rtx backend needs .* no CUDA GPU is visible"):
        create_backend("tensorrt-rtx", DEMO)
    with create_backend("auto", DEMO, threads=1) as backend:
        assert backend.name == "onnxruntime" and not backend.gpu_data_path
        assert "tensorrt-rtx: no CUDA GPU is visible" in backend.selection


@pytest.mark.parametrize(
    ("text", "targets"),
    [("sm86", ("8.6",)), ("sm_89,sm86", ("8.6", "8.9")), ("8.0, 12.0", ("8.0", "12.0"))],
)
def test_targets_are_read_as_compute_capabilities(text: str, targets: tuple[str, ...]) -> None:
    assert parse_targets(text) == targets
    with pytest.raises(LibraryError):
        parse_targets("sm8")


def test_parser_errors_name_the_failing_node(tmp_path: Path) -> None:
    images = helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 32, 32])
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 5, 16])  # a raw head
    nodes = [
        helper.make_node("Relu", ["images"], ["r"], name="relu_fine"),
        helper.make_node("Frobnicate", ["r"], ["out"], name="frobnicate_here", domain="x.y"),
    ]
    graph = helper.make_graph(nodes, "bad", [images], [out])
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("x.y", 1)]
    )
    model.metadata_props.add(key="names", value=str({0: "a"}))
    path = tmp_path / "bad.onnx"
    onnx.save(model, str(path))
    with pytest.raises(BuildError) as failed:
        build_cached(path, BuildOptions(), tmp_path, lib="tensorrt-rtx", targets=("8.6",))
    message = str(failed.value)
    assert f"TensorRT for RTX {VERSION} could not parse" in message
    assert "node 1 'frobnicate_here' (Frobnicate)" in message
    assert not list(tmp_path.glob("*.plan"))


# ---- on a GPU that TensorRT for RTX runs on ------------------------------------------------


def _supported_gpu_reason() -> str | None:
    if gpu_count() == 0:
        return "no GPU is visible"
    gpu = gpu_identity(0)
    if not TENSORRT_RTX.runs_on(gpu.compute_capability):
        return f"TensorRT for RTX does not run on {gpu.name} ({gpu.compute_capability})"
    return None


def _frames(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = np.full((n, 3, 640, 640), 114 / 255, np.float32)
    for i in range(n):
        for _ in range(4):
            y0, x0 = rng.integers(0, 520, size=2)
            x[i, :, y0 : y0 + 100, x0 : x0 + 100] = rng.random((3, 1, 1), dtype=np.float32)
    return x


@pytest.mark.gpu
def test_on_a_supported_gpu_the_engine_matches_onnxruntime_and_keeps_its_runtime_cache(
    tmp_path: Path,
) -> None:
    if (why := _supported_gpu_reason()) is not None:
        pytest.skip(why)
    from vdet.inference.backends.onnxruntime import OnnxRuntimeBackend
    from vdet.inference.backends.tensorrt import TensorRTBackend, create_tensorrt_rtx_backend

    gpu = gpu_identity(0)
    plan = build_cached(DEMO, BuildOptions(), tmp_path, lib="tensorrt-rtx").plan
    assert read_manifest(plan).key.targets == (gpu.compute_capability,)
    x = _frames(2)
    with TensorRTBackend(plan) as engine, OnnxRuntimeBackend(DEMO) as reference:
        assert engine.name == "tensorrt-rtx" and engine.gpu_data_path
        np.testing.assert_allclose(engine.infer(x), reference.infer(x), atol=2e-2, rtol=1e-2)
    assert runtime_cache_path(plan, gpu).is_file()
    # A cached plan for this GPU is what the backend factory serves.
    from vdet.config.engine import EngineSettings

    served = create_tensorrt_rtx_backend(DEMO, engine=EngineSettings(cache_dir=tmp_path))
    with served:
        assert isinstance(served, TensorRTBackend) and served.plan == plan


@pytest.mark.gpu
def test_on_a_supported_gpu_the_cuda_graph_path_replays_what_eager_gives(tmp_path: Path) -> None:
    """Our NV12 letterbox kernel, the engine's enqueue and our NVRTC decode + NMS in one CUDA
    graph per stream (vdet.gpu.devices), replay against eager and against ONNX Runtime."""
    if (why := _supported_gpu_reason()) is not None:
        pytest.skip(why)
    import cv2
    import torch

    from vdet.config.gpu import GpuSettings
    from vdet.core.types import ColourMatrix, ColourRange
    from vdet.gpu.devices import GpuTuning, build_gpu_pool
    from vdet.inference.backends.tensorrt import TensorRTBackend
    from vdet.inference.detector import Detector
    from vdet.ingest.nvdec import GpuVideoFrame
    from vdet.modelkit.dataset.synthetic import SceneConfig, render_image

    plan = build_cached(DEMO, BuildOptions(), tmp_path, lib="tensorrt-rtx").plan
    frames = []
    for seed in range(3):
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
        frames.append((frame, bgr))
    with TensorRTBackend(plan) as engine, Detector.open(DEMO, "onnxruntime") as reference:
        results = {}
        for graphs in (True, False):
            pool = build_gpu_pool(
                GpuSettings(devices=[0]), engine, tuning=GpuTuning(cuda_graphs=graphs)
            )
            try:
                worker = pool.devices[0]
                results[graphs] = [
                    worker.detect(f"cam{i}", frame, reference.params)[0]
                    for i, (frame, _) in enumerate(frames)
                ]
            finally:
                pool.close()
        expected = reference.detect([bgr for _, bgr in frames])
    for replayed, eager, (cpu, _) in zip(results[True], results[False], expected, strict=True):
        np.testing.assert_array_equal(replayed.class_ids, eager.class_ids)
        np.testing.assert_allclose(replayed.xyxy, eager.xyxy, atol=1e-3)
        assert len(replayed.xyxy) == len(cpu.xyxy) > 0
