"""The TensorRT plugin's own code on the CPU: plugins/tests/plugin_harness.cpp in the emulator.

The harness is compiled with g++ against TensorRT's public headers (no TensorRT library: the
plugin registers through getCreators and never links libnvinfer) together with vdet_plugin.cpp
and decode_nms_launch.cpp built for the CPU emulator of the CUDA kernels (tests/support/kernels/emu,
-DVDET_LAUNCH_EMULATION). It then runs what TensorRT would call: the creator, createPlugin from
fields, the build-time queries, the serialization round trip and `enqueue`, whose four kernel
launches run in the emulator. The outputs are compared with the CPU reference
(`decode_and_nms_image`).

What this does not cover: TensorRT's parser, builder and runtime, `getOutputShapes` (its
IExprBuilder is a TensorRT object), and the real GPU. tests/tensorrt/ covers those
where TensorRT and a GPU exist.

Needs g++, TensorRT headers ($TensorRT_ROOT/include, or /usr/include/x86_64-linux-gnu as in
NGC's containers) and CUDA headers; skipped otherwise.
"""

from __future__ import annotations

import ctypes
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support.tools import REPO

from vdet.cuda import ops
from vdet.inference.postprocess import PostprocessParams, decode_and_nms_image

pytestmark = pytest.mark.slow

ROOT = REPO
PLUGINS = ROOT / "plugins"
# The plugin includes the kernel sources as "kernels/...": they are package data of vdet.
PACKAGE = ROOT / "service" / "vdet"
# The same variable plugins/CMakeLists.txt reads: the prefix whose include/ has TensorRT's headers.
TENSORRT_ROOT_ENV = "TensorRT_ROOT"


def _tensorrt_include() -> Path | None:
    candidates = []
    root = os.environ.get(TENSORRT_ROOT_ENV)
    if root:
        candidates.append(Path(root) / "include")
    candidates += [Path("/usr/include/x86_64-linux-gnu"), Path("/usr/include")]
    return next((p for p in candidates if (p / "NvInferRuntime.h").is_file()), None)


def _cuda_include() -> Path | None:
    candidates = [Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"]
    candidates += [Path(p) / "nvidia" / "cu13" / "include" for p in sys.path if p]
    return next((p for p in candidates if (p / "cuda_runtime_api.h").is_file()), None)


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cxx = shutil.which("g++")
    trt_include, cuda_include = _tensorrt_include(), _cuda_include()
    if cxx is None or trt_include is None or cuda_include is None:
        pytest.skip("needs g++, TensorRT headers ($TensorRT_ROOT/include) and CUDA headers")
    if not (PACKAGE / "cuda" / "kernels" / "decode_nms.cu").is_file():
        pytest.skip("service/vdet/cuda/kernels/ (the decode + NMS kernels) is not present")
    try:
        from support.kernels.emulator import build_emulator  # the kernels' CPU emulator
    except ImportError:
        pytest.skip("the kernel emulator (tests/support/kernels/emulator.py) is not present")
    work = tmp_path_factory.mktemp("plugin-emulated")
    emulator = build_emulator(work / "emu")
    binary = work / "vdet_plugin_harness_emulated"
    command = [
        cxx, "-std=c++17", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-DVDET_LAUNCH_EMULATION",
        "-isystem", str(trt_include), "-isystem", str(cuda_include),
        f"-I{PLUGINS}", f"-I{PACKAGE / 'cuda'}",
        str(PLUGINS / "tests" / "plugin_harness.cpp"), str(PLUGINS / "vdet_plugin.cpp"),
        str(PLUGINS / "decode_nms_launch.cpp"), str(emulator), f"-Wl,-rpath,{emulator.parent}",
        "-o", str(binary),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"{' '.join(command)}\n{result.stderr}"
    return binary


def test_harness_self_checks(harness: Path) -> None:
    """Creator, fields, build queries, serialization and hand-computed enqueue results."""
    result = subprocess.run([str(harness)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "all checks passed" in result.stdout


def _random_head(rng: np.random.Generator, batch: int, nc: int, anchors: int) -> np.ndarray:
    """Clustered boxes (so NMS has work) and distinct scores (so the order is unambiguous)."""
    centres = rng.uniform(40, 600, size=(batch, 6, 2))
    pick = rng.integers(0, 6, size=(batch, anchors))
    cxcy = np.take_along_axis(centres, pick[..., None], axis=1) + rng.normal(
        0, 6, (batch, anchors, 2)
    )
    wh = rng.uniform(20, 90, size=(batch, anchors, 2))
    scores = rng.permutation(batch * nc * anchors).reshape(batch, anchors, nc)
    scores = 0.001 + 0.998 * scores / scores.max()
    head = np.concatenate([cxcy, wh, scores], axis=2).transpose(0, 2, 1)
    return np.ascontiguousarray(head, dtype=np.float32)


@pytest.mark.parametrize(
    ("half", "agnostic", "score", "iou", "top_k", "max_det"),
    [
        (False, False, 0.25, 0.45, 1000, 300),
        (False, True, 0.5, 0.3, 100, 20),
        (True, False, 0.1, 0.6, 64, 7),
    ],
)
def test_enqueue_matches_the_cpu_reference(
    harness: Path,
    tmp_path: Path,
    half: bool,
    agnostic: bool,
    score: float,
    iou: float,
    top_k: int,
    max_det: int,
) -> None:
    batch, nc, anchors = 3, 5, 300
    raw = _random_head(np.random.default_rng(7), batch, nc, anchors)
    if half:  # the plugin reads IEEE half; feed values that half holds exactly
        raw = raw.astype(np.float16).astype(np.float32)
    raw.tofile(tmp_path / "raw.f32")
    command = [
        str(harness), "--raw", str(tmp_path / "raw.f32"), "--shape", f"{batch},{4 + nc},{anchors}",
        "--score", repr(score), "--iou", repr(iou), "--top-k", str(top_k),
        "--max-det", str(max_det), "--out", str(tmp_path / "dets.f32"),
        "--count", str(tmp_path / "count.i32"),
    ]  # fmt: skip
    if half:
        command.append("--half")
    if agnostic:
        command.append("--agnostic")
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    dets = np.fromfile(tmp_path / "dets.f32", np.float32).reshape(batch, max_det, 6)
    counts = np.fromfile(tmp_path / "count.i32", np.int32)

    params = PostprocessParams(
        conf_threshold=score,
        iou_threshold=iou,
        top_k=top_k,
        max_det=max_det,
        class_agnostic=agnostic,
    )
    total = 0
    for b in range(batch):
        expected, _ = decode_and_nms_image(raw[b], params)
        n = len(expected.scores)
        total += n
        assert counts[b] == n
        np.testing.assert_allclose(dets[b, :n, :4], expected.xyxy, atol=1e-4, rtol=0)
        np.testing.assert_array_equal(dets[b, :n, 4], expected.scores)
        np.testing.assert_array_equal(dets[b, :n, 5], expected.class_ids.astype(np.float32))
        assert not dets[b, n:].any()  # zero after the last detection
    assert total > batch  # the case exercised NMS, not an empty output


# ---- the C launcher and vdet.cuda.ops agree (no TensorRT headers needed) ---------------------


def test_launcher_constants_mirror_ops() -> None:
    """The launch shapes of decode_nms_launch.cpp are the Python launcher's (and the kernels')."""
    source = (PLUGINS / "decode_nms_launch.cpp").read_text()

    def constant(name: str) -> int:
        match = re.search(rf"constexpr (?:int|size_t) {name} = ([0-9 *+]+);", source)
        assert match, name
        # A sum of products of literals, e.g. "256 * 4 + 16 * 4".
        return sum(math.prod(int(f) for f in term.split("*")) for term in match.group(1).split("+"))

    assert constant("kAlign") == 256
    assert constant("kSelectThreads") == ops.SELECT_THREADS
    assert constant("kMaskThreads") == ops.MASK_THREADS
    assert constant("kScanThreads") == ops.SCAN_THREADS
    assert constant("kSelectSmemHeader") == ops.SELECT_SMEM_HEADER
    assert constant("kScanSmemHeader") == ops.SCAN_SMEM_HEADER
    assert constant("kScanStaticSmem") == ops.SCAN_STATIC_SMEM


@pytest.fixture(scope="module")
def launcher(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("needs g++")
    try:
        from support.kernels.emulator import build_emulator
    except ImportError:
        pytest.skip("the kernel emulator (tests/support/kernels/emulator.py) is not present")
    work = tmp_path_factory.mktemp("launcher")
    emulator = build_emulator(work / "emu")
    library = work / "liblauncher.so"
    command = [
        cxx, "-std=c++17", "-O1", "-fPIC", "-shared", "-Wall", "-Wextra", "-Werror",
        "-DVDET_LAUNCH_EMULATION", f"-I{PLUGINS}", f"-I{PACKAGE / 'cuda'}",
        str(PLUGINS / "decode_nms_launch.cpp"), str(emulator), f"-Wl,-rpath,{emulator.parent}",
        "-o", str(library),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    lib = ctypes.CDLL(str(library))
    lib.vdet_decode_nms_workspace_bytes.restype = ctypes.c_size_t
    lib.vdet_decode_nms_workspace_bytes.argtypes = [ctypes.c_int] * 3
    return lib


@pytest.mark.parametrize(
    ("batch", "anchors", "top_k"),
    [(1, 8400, 1000), (32, 8400, 1000), (3, 300, 64), (1, 1, 1), (7, 2100, 4096), (0, 10, 5)],
)
def test_workspace_layout_matches_ops(
    launcher: ctypes.CDLL, batch: int, anchors: int, top_k: int
) -> None:
    assert launcher.vdet_decode_nms_workspace_bytes(batch, anchors, top_k) == (
        ops.decode_nms_workspace_bytes(batch, anchors, top_k)
    )


class _LaunchParams(ctypes.Structure):
    """VdetDecodeNmsParams of decode_nms_launch.h."""

    _fields_ = (
        ("score_threshold", ctypes.c_float),
        ("iou_threshold", ctypes.c_float),
        ("top_k", ctypes.c_int),
        ("max_det", ctypes.c_int),
        ("class_agnostic", ctypes.c_int),
    )


@pytest.mark.parametrize(
    ("half", "nc", "anchors", "top_k", "max_shared"),
    [
        (False, 20, 3000, 1000, 232448),  # an H200: the keys fit in shared memory
        (True, 20, 3000, 1000, 232448),
        (False, 4, 5000, 2048, 0),  # 48 KiB, the default: keys read from global memory
        (False, 3, 700, 1000, 0),  # fewer candidates than top_k
    ],
)
def test_launch_matches_the_cpu_reference(
    launcher: ctypes.CDLL, half: bool, nc: int, anchors: int, top_k: int, max_shared: int
) -> None:
    """vdet_decode_nms_launch itself (argument order, launch shapes and shared memory of every
    kernel) on the emulator, vs `decode_and_nms_image`: dense scores quantized to 1/64 (many
    ties, also at the top_k boundary), clustered boxes."""
    batch = 2
    rng = np.random.default_rng(anchors + top_k)
    raw = _random_head(rng, batch, nc, anchors)
    raw[:, 4:] = np.round(rng.uniform(0.2, 0.9, (batch, nc, anchors)) * 64) / 64
    if half:
        raw = raw.astype(np.float16).astype(np.float32)
    params = PostprocessParams(top_k=top_k, max_det=300)
    c_params = _LaunchParams(0.25, 0.45, top_k, 300, 0)
    need = launcher.vdet_decode_nms_workspace_bytes(batch, anchors, top_k)
    workspace = np.zeros(need + 256, np.uint8)
    offset = -workspace.ctypes.data % 256
    out = np.full((batch, 300, 6), np.nan, np.float32)
    count = np.full((batch,), -1, np.int32)
    head = np.ascontiguousarray(raw.astype(np.float16) if half else raw)
    status = launcher.vdet_decode_nms_launch(
        ctypes.c_void_p(head.ctypes.data), int(half), batch, nc, anchors, ctypes.byref(c_params),
        ctypes.c_void_p(out.ctypes.data), ctypes.c_void_p(count.ctypes.data),
        ctypes.c_void_p(workspace.ctypes.data + offset), ctypes.c_size_t(need), max_shared, None,
    )  # fmt: skip
    launcher.vdet_decode_nms_error.restype = ctypes.c_char_p
    assert status == 0, launcher.vdet_decode_nms_error(status)
    for b in range(batch):
        expected, _ = decode_and_nms_image(raw[b], params)
        n = len(expected.scores)
        assert count[b] == n
        np.testing.assert_array_equal(out[b, :n, 4], expected.scores)
        np.testing.assert_array_equal(out[b, :n, 5], expected.class_ids.astype(np.float32))
        np.testing.assert_allclose(out[b, :n, :4], expected.xyxy, rtol=1e-4, atol=1e-6)
        assert not out[b, n:].any()
