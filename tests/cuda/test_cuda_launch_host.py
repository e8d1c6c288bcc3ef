"""Host side of the CUDA kernels, no GPU needed: cache keys, NVRTC targets, argument checks,
struct layouts, launch shapes and the errors a machine without CUDA gets."""

from __future__ import annotations

import ctypes
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from vdet.core import contract
from vdet.cuda import launch, ops
from vdet.cuda.launch import (
    KERNEL_DIR,
    CudaUnavailableError,
    DeviceArray,
    Dim3,
    KernelArg,
    KernelError,
    cache_key,
    check,
    device_array,
    kernel_sources,
    pick_arch,
    stream_handle,
)
from vdet.cuda.ops import GpuOps, decode_nms_layout, nv12_to_bgr, yuv_coefficients
from vdet.inference.postprocess import PostprocessParams

# ---- cache keys and targets -------------------------------------------------------------------

SOURCES = {"a.cu": '#include "b.cuh"\n', "b.cuh": "int x;\n"}
OPTIONS = ["--gpu-architecture=sm_90", "--include-path=/x", "--fmad=false"]


def test_cache_key_is_stable_and_ignores_the_include_path() -> None:
    key = cache_key("m", SOURCES, "sm_90", (13, 0), OPTIONS)
    assert key == cache_key("m", dict(SOURCES), "sm_90", (13, 0), OPTIONS)
    moved = [o.replace("/x", "/elsewhere") for o in OPTIONS]
    assert key == cache_key("m", SOURCES, "sm_90", (13, 0), moved)
    assert re.fullmatch(r"[0-9a-f]{64}", key)


@pytest.mark.parametrize(
    "change",
    [
        {"module": "other"},
        {"sources": {**SOURCES, "b.cuh": "int y;\n"}},
        {"sources": {**SOURCES, "c.h": ""}},
        {"arch": "sm_89"},
        {"version": (13, 1)},
        {"options": [*OPTIONS, "--ftz=true"]},
    ],
    ids=["module", "header-text", "new-header", "arch", "nvrtc-version", "option"],
)
def test_cache_key_changes_with_what_the_cubin_depends_on(change: dict[str, Any]) -> None:
    args: dict[str, Any] = {
        "module": "m",
        "sources": SOURCES,
        "arch": "sm_90",
        "version": (13, 0),
        "options": OPTIONS,
    }
    base = cache_key(args["module"], args["sources"], args["arch"], args["version"], OPTIONS)
    args.update(change)
    changed = cache_key(
        args["module"], args["sources"], args["arch"], args["version"], args["options"]
    )
    assert changed != base


def test_pick_arch() -> None:
    supported = [75, 80, 86, 89, 90, 100, 120]
    assert pick_arch(9, 0, supported) == "sm_90"
    assert pick_arch(8, 7, supported) == "compute_86"  # machine code unknown to NVRTC: PTX
    with pytest.raises(KernelError, match="supports none"):
        pick_arch(7, 0, supported)


def test_kernel_sources_are_complete() -> None:
    sources = kernel_sources()
    for unit in launch.MODULE_SOURCES.values():
        assert unit in sources
        for header in re.findall(r'#include "([^"]+)"', sources[unit]):
            assert header in sources
    with pytest.raises(KernelError, match="not found"):
        kernel_sources(KERNEL_DIR / "missing")


def test_nvrtc_options_keep_float_exactness() -> None:
    options = launch.nvrtc_options("sm_90")
    assert "--fmad=false" in options and "--prec-div=true" in options
    assert not any("fast-math" in o or "fast_math" in o for o in options)
    assert options[0] == "--gpu-architecture=sm_90"


def test_compile_module_caches_cubins(tmp_path: Path) -> None:
    """NVRTC needs no GPU: compile for sm_90, then the second call reads the cache."""
    pytest.importorskip("cuda.bindings")
    try:
        first = launch.compile_module("decode_nms", "sm_90", cache_dir=tmp_path)
    except (CudaUnavailableError, OSError, RuntimeError) as exc:
        pytest.skip(f"NVRTC unavailable: {exc}")
    assert not first.from_cache and first.image
    (cached,) = tmp_path.iterdir()
    assert cached.name.startswith("decode_nms-sm_90-") and cached.suffix == ".cubin"
    second = launch.compile_module("decode_nms", "sm_90", cache_dir=tmp_path)
    assert second.from_cache and second.image == first.image
    with pytest.raises(KernelError, match="unknown kernel module"):
        launch.compile_module("nope", "sm_90", cache_dir=tmp_path)
    # NVRTC writes into the buffers it is given: the interned b" " must come out untouched.
    assert bytes([32]) == b" "


@pytest.mark.parametrize("module", sorted(launch.MODULE_SOURCES))
@pytest.mark.parametrize("arch", ["sm_86", "sm_90"])
def test_every_module_compiles_cleanly(module: str, arch: str, tmp_path: Path) -> None:
    """Each kernel module compiles for the A10's and the H200's architectures with an empty
    log (no warnings), and its kernels are found by name."""
    pytest.importorskip("cuda.bindings")
    try:
        compiled = launch.compile_module(module, arch, cache_dir=tmp_path)
    except (CudaUnavailableError, OSError, RuntimeError) as exc:
        pytest.skip(f"NVRTC unavailable: {exc}")
    assert compiled.image and compiled.log == ""
    source = kernel_sources()[launch.MODULE_SOURCES[module]]
    kernels = re.findall(r"\b(vdet_\w+)\(", source.split('extern "C"', 1)[-1])
    kernels = [k for k in kernels if k.startswith(("vdet_letterbox_", "vdet_layer_", "vdet_nms_"))
               or k.startswith(("vdet_decode_", "vdet_select_"))]  # fmt: skip
    assert kernels
    for kernel in kernels:
        assert launch._kernel_module(kernel) == module, kernel


def test_default_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    launch.use_cache_dir(tmp_path / "k")  # the setting gpu.kernel_cache_dir
    assert launch.default_cache_dir() == tmp_path / "k"
    launch.use_cache_dir(None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert launch.default_cache_dir() == tmp_path / "vdet" / "kernels"


# ---- errors -----------------------------------------------------------------------------------


class FakeStatus(int):
    name = "CUDA_ERROR_FAKE"


def test_check_returns_values_and_names_errors() -> None:
    assert check((0,), "cuInit") is None
    assert check((0, 5), "cuDeviceGetCount") == 5
    assert check((0, 1, 2), "two") == (1, 2)
    with pytest.raises(KernelError, match=r"^cuModuleLoadData failed: CUDA_ERROR_FAKE$"):
        check((FakeStatus(200),), "cuModuleLoadData")


def test_check_names_real_cuda_errors() -> None:
    driver = pytest.importorskip("cuda.bindings.driver")
    with pytest.raises(KernelError, match="cuFoo failed: CUDA_ERROR_INVALID_VALUE"):
        check((driver.CUresult.CUDA_ERROR_INVALID_VALUE,), "cuFoo")


def test_missing_cuda_python_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)
    with pytest.raises(CudaUnavailableError, match=r"scripts/setup.sh --extras gpu"):
        launch.CudaBackend()


def test_gpu_ops_without_a_gpu_raise_a_clear_error() -> None:
    """On a machine without a usable CUDA device, using the kernels raises (importing didn't)."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(CudaUnavailableError):
        GpuOps()


# ---- arrays and streams -----------------------------------------------------------------------


class FakeCudaArray:
    def __init__(self, shape: tuple[int, ...], typestr: str, strides: Any = None) -> None:
        self.__cuda_array_interface__ = {
            "shape": shape,
            "typestr": typestr,
            "data": (0x7000, False),
            "strides": strides,
            "version": 3,
        }


def test_device_array_from_the_cuda_array_interface() -> None:
    view = device_array(FakeCudaArray((2, 3, 4), "<f4"))
    assert view == DeviceArray(0x7000, (2, 3, 4), np.dtype(np.float32), (48, 16, 4))
    assert view.is_contiguous and view.nbytes == 96
    pitched = device_array(FakeCudaArray((1080, 1920), "|u1", (2048, 1)))
    assert not pitched.is_contiguous and pitched.strides == (2048, 1)


def test_device_array_rejects_host_memory() -> None:
    with pytest.raises(ValueError, match="expected a CUDA tensor"):
        device_array(np.zeros(3))
    assert device_array(np.zeros(3, np.float32), allow_host=True).shape == (3,)
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="expected a CUDA tensor"):
        device_array(torch.zeros(3))


@pytest.mark.parametrize("name", ["uint8", "uint16", "float16", "float32", "int32", "int64"])
def test_device_array_of_every_torch_dtype_a_kernel_takes(name: str) -> None:
    """P016 surfaces arrive as uint16 tensors: the launcher must describe them."""
    torch = pytest.importorskip("torch")
    tensor = torch.zeros((4, 6), dtype=getattr(torch, name))
    view = device_array(tensor, allow_host=True)
    assert view.dtype == np.dtype(name) and view.shape == (4, 6)
    assert view.strides == (6 * view.dtype.itemsize, view.dtype.itemsize)


def test_stream_handle() -> None:
    class TorchLike:
        cuda_stream = 1234

    class CupyLike:
        ptr = 99

    class CoreLike:
        def __cuda_stream__(self) -> tuple[int, int]:
            return (0, 77)

    assert stream_handle(None) == 0
    assert stream_handle(5) == 5
    assert stream_handle(TorchLike()) == 1234
    assert stream_handle(CupyLike()) == 99
    assert stream_handle(CoreLike()) == 77
    with pytest.raises(ValueError, match="stream handle"):
        stream_handle("default")


# ---- structs and constants mirror the C header ------------------------------------------------


def test_structs_and_limits_match_the_header() -> None:
    header = (KERNEL_DIR / "vdet_kernels.h").read_text()
    header += (KERNEL_DIR / "vdet_contract.h").read_text()  # included by vdet_kernels.h
    defines = dict(re.findall(r"#define (VDET_\w+) (\d+)\n", header))
    assert int(defines["VDET_MAX_FRAMES"]) == ops.MAX_FRAMES
    assert int(defines["VDET_MAX_FILTER_CLASSES"]) == ops.MAX_FILTER_CLASSES
    assert int(defines["VDET_MAX_TOP_K"]) == contract.MAX_TOP_K == ops.MAX_TOP_K
    assert int(defines["VDET_PAD_VALUE"]) == contract.PAD_VALUE
    assert ctypes.sizeof(ops._Frame) == 48
    assert ctypes.sizeof(ops._FrameBatch) == 48 * ops.MAX_FRAMES
    assert ctypes.sizeof(ops._YuvCoefficients) == 24
    assert ctypes.sizeof(ops._SampleScale) == 12
    fields = re.search(r"typedef struct VdetSampleScale \{([^}]*)\}", header)
    assert fields is not None
    assert re.findall(r"(\w+);", fields.group(1)) == [n for n, _ in ops._SampleScale._fields_]
    assert ctypes.sizeof(ops._ClassMask) == ops.MAX_FILTER_CLASSES // 8
    source = (KERNEL_DIR / "decode_nms.cuh").read_text()
    for name in ("SELECT_THREADS", "MASK_THREADS", "SCAN_THREADS"):
        assert re.search(rf"#define VDET_{name} {getattr(ops, name)}\b", source)


# ---- YUV ---------------------------------------------------------------------------------------


def test_yuv_coefficients_bt601_limited() -> None:
    k = yuv_coefficients("bt601", full_range=False)
    np.testing.assert_allclose(
        [k.y_offset, k.y_scale, k.r_v, k.g_u, k.g_v, k.b_u],
        [16, 1.164384, 1.596027, 0.391762, 0.812968, 2.017232],
        rtol=1e-5,
    )
    # Each coefficient is a float32 value, so host references and kernels use the same numbers.
    assert all(v == float(np.float32(v)) for v in vars(k).values())


def test_yuv_coefficients_reject_unknown_matrix() -> None:
    with pytest.raises(ValueError, match="matrix"):
        yuv_coefficients("bt2020")  # type: ignore[arg-type]


def test_nv12_reference_agrees_with_opencv() -> None:
    """The NumPy NV12 reference (BT.601 limited) is OpenCV's conversion within one level."""
    rng = np.random.default_rng(0)
    h, w = 64, 96
    nv12 = rng.integers(16, 236, (h * 3 // 2, w), np.uint8)
    ours = nv12_to_bgr(nv12[:h], nv12[h:], yuv_coefficients("bt601", False))
    theirs = cv2.cvtColor(nv12, cv2.COLOR_YUV2BGR_NV12)
    assert np.abs(ours.astype(int) - theirs.astype(int)).max() <= 1


# ---- workspace layout and argument checks -----------------------------------------------------


def test_workspace_layout() -> None:
    layout = decode_nms_layout(2, 8400, 1000)
    assert layout.words == 16 and layout.cand_cap == 1024
    offsets = [layout.counts, layout.cand_count, layout.keys, layout.best_class,
               layout.cand_box, layout.cand_score, layout.cand_class, layout.cand_anchor,
               layout.mask]  # fmt: skip
    assert offsets == sorted(offsets) and all(o % 256 == 0 for o in offsets)
    assert layout.nbytes >= layout.mask + 8 * 2 * 1024 * 16
    assert ops.decode_nms_workspace_bytes(2, 8400, 1000) == layout.nbytes
    with pytest.raises(ValueError, match="top_k"):
        decode_nms_layout(1, 8400, ops.MAX_TOP_K + 1)
    with pytest.raises(ValueError, match="batch"):
        decode_nms_layout(-1, 8400, 10)


class RecordingBackend:
    """Launches nothing; records what would be launched. Arrays are NumPy."""

    def __init__(self) -> None:
        self.launches: list[tuple[str, Dim3, Dim3, int, int, list[KernelArg]]] = []
        self.memsets: list[tuple[int, int, int]] = []

    @property
    def max_shared_bytes(self) -> int:
        return 232448

    def array(self, obj: object) -> DeviceArray:
        return device_array(obj, allow_host=True)

    def launch(
        self,
        kernel: str,
        grid: Dim3,
        block: Dim3,
        shared_bytes: int,
        stream: int,
        args: Sequence[KernelArg],
    ) -> None:
        self.launches.append((kernel, grid, block, shared_bytes, stream, list(args)))

    def memset_u32(self, ptr: int, value: int, count: int, stream: int) -> None:
        self.memsets.append((value, count, stream))

    def alloc(self, nbytes: int, stream: int) -> int:
        return 0x1000

    def free(self, ptr: int, stream: int) -> None:
        pass


@pytest.fixture
def recorder() -> tuple[GpuOps, RecordingBackend]:
    backend = RecordingBackend()
    return GpuOps(backend), backend


def test_letterbox_launches_in_chunks_of_max_frames(
    recorder: tuple[GpuOps, RecordingBackend],
) -> None:
    gpu, backend = recorder
    frames = [np.zeros((10, 20, 3), np.uint8)] * (ops.MAX_FRAMES + 3)
    out = np.zeros((len(frames), 3, 40, 50), np.float16)
    transforms = gpu.letterbox_bgr(frames, out, stream=7)
    assert len(transforms) == len(frames)
    assert [(k, g, s) for k, g, _, _, s, _ in backend.launches] == [
        ("vdet_letterbox_bgr_f16", (2, 5, ops.MAX_FRAMES), 7),
        ("vdet_letterbox_bgr_f16", (2, 5, 3), 7),
    ]
    second_out = backend.launches[1][5][1]
    assert isinstance(second_out, ctypes.c_uint64)
    assert second_out.value == out.ctypes.data + ops.MAX_FRAMES * 3 * 40 * 50 * 2


def test_letterbox_passes_geometry_from_compute_letterbox(
    recorder: tuple[GpuOps, RecordingBackend],
) -> None:
    gpu, backend = recorder
    image = np.zeros((51, 100, 3), np.uint8)
    gpu.letterbox_bgr([image], np.zeros((1, 3, 64, 64), np.float32))
    batch = backend.launches[0][5][0]
    assert isinstance(batch, ops._FrameBatch)
    f = batch.frames[0]
    assert (f.src_w, f.src_h, f.new_w, f.new_h, f.left, f.top, f.pitch0) == (
        100, 51, 64, 33, 0, 15, 300,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("frames", "out", "match"),
    [
        ([np.zeros((4, 4, 4), np.uint8)], np.zeros((1, 3, 8, 8), np.float32), "HxWx3 uint8"),
        ([np.zeros((4, 4, 3), np.float32)], np.zeros((1, 3, 8, 8), np.float32), "HxWx3 uint8"),
        ([np.zeros((4, 4, 3), np.uint8)], np.zeros((2, 3, 8, 8), np.float32), r"\(1, 3, H, W\)"),
        ([np.zeros((4, 4, 3), np.uint8)], np.zeros((1, 3, 8, 8), np.float64), "float32 or"),
        ([np.zeros((4, 4, 3), np.uint8)], np.zeros((1, 3, 8, 8), np.float32)[..., ::2], "contig"),
        ([np.zeros((4, 4, 3), np.uint8)[:, ::-1]], np.zeros((1, 3, 8, 8), np.float32), "packed"),
        ([np.zeros((0, 4, 3), np.uint8)], np.zeros((1, 3, 8, 8), np.float32), "positive"),
    ],
    ids=["channels", "dtype", "batch", "out-dtype", "out-strided", "flipped", "empty-frame"],
)
def test_letterbox_bgr_rejects_bad_tensors(
    recorder: tuple[GpuOps, RecordingBackend], frames: list[Any], out: Any, match: str
) -> None:
    gpu, backend = recorder
    with pytest.raises(ValueError, match=match):
        gpu.letterbox_bgr(frames, out)
    assert not backend.launches


def test_letterbox_nv12_rejects_bad_planes(recorder: tuple[GpuOps, RecordingBackend]) -> None:
    gpu, _ = recorder
    y = np.zeros((9, 7), np.uint8)
    out = np.zeros((1, 3, 8, 8), np.float32)
    with pytest.raises(ValueError, match="5 rows of 4 packed U,V pairs"):
        gpu.letterbox_nv12([y], [np.zeros((4, 4, 2), np.uint8)], out)
    with pytest.raises(ValueError, match="Y plane 0 must be"):
        gpu.letterbox_nv12([np.zeros((9, 7, 2), np.uint8)], [np.zeros((5, 4, 2), np.uint8)], out)
    with pytest.raises(ValueError, match="1 Y planes and 2 UV planes"):
        gpu.letterbox_nv12([y], [y, y], out)
    with pytest.raises(ValueError, match="matrix"):
        gpu.letterbox_nv12([y], [np.zeros((5, 8), np.uint8)], out, matrix="srgb")  # type: ignore[arg-type]
    gpu.letterbox_nv12([y], [np.zeros((5, 8), np.uint8)], out)  # odd sizes, 2-D UV: accepted


def decode_args(
    B: int = 2, nc: int = 3, N: int = 50, max_det: int = 300, raw_dtype: Any = np.float32
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (
        np.zeros((B, 4 + nc, N), raw_dtype),
        np.zeros((B, max_det, 6), np.float32),
        np.zeros((B,), np.int32),
    )


def test_decode_nms_launch_sequence(recorder: tuple[GpuOps, RecordingBackend]) -> None:
    gpu, backend = recorder
    gpu.decode_nms(*decode_args(B=3, N=8400), PostprocessParams(), stream=5)
    assert backend.memsets == [(0, 3, 5)]
    shapes = [(k, g, b) for k, g, b, _, _, _ in backend.launches]
    assert shapes == [
        ("vdet_decode_candidates_f32", (263, 3, 1), (32, 8, 1)),
        ("vdet_select_topk_f32", (3, 1, 1), (1024, 1, 1)),
        ("vdet_nms_mask", (16, 16, 3), (256, 1, 1)),
        ("vdet_nms_scan", (3, 1, 1), (512, 1, 1)),
    ]
    select_smem = backend.launches[1][3]
    assert select_smem == ops.SELECT_SMEM_HEADER + 8 * 1024 + 8 * 8400
    # The whole 16-word mask triangle fits on an H200: the sweep preloads it.
    assert backend.launches[3][3] == ops.SCAN_SMEM_HEADER + 8 * 64 * 136 + 4 * 300
    assert all(stream == 5 for *_, stream, _ in backend.launches)


def test_scan_shared_bytes_preloads_only_what_fits() -> None:
    assert ops.scan_shared_bytes(16, 300, 232448) == 512 + 8 * 64 * 136 + 1200
    # top_k 4096: a 64-word triangle (1 MiB) cannot fit, two row tiles do.
    assert ops.scan_shared_bytes(64, 300, 232448) == 512 + 2 * 64 * 8 * 64 + 1200
    assert ops.scan_shared_bytes(16, 300, 48 * 1024) == 512 + 2 * 64 * 8 * 16 + 1200


def test_decode_nms_thresholds_are_rounded_to_float32(
    recorder: tuple[GpuOps, RecordingBackend],
) -> None:
    gpu, backend = recorder
    gpu.decode_nms(*decode_args(), PostprocessParams(conf_threshold=0.1, iou_threshold=0.7))
    conf = backend.launches[0][5][3]
    iou = backend.launches[2][5][5]
    assert isinstance(conf, ctypes.c_float) and conf.value == float(np.float32(0.1))
    assert isinstance(iou, ctypes.c_float) and iou.value == float(np.float32(0.7))


def test_decode_nms_class_filter_bitmask(recorder: tuple[GpuOps, RecordingBackend]) -> None:
    gpu, backend = recorder
    params = PostprocessParams(classes=frozenset({0, 33, 79, 80, 4000}))
    gpu.decode_nms(*decode_args(nc=80), params)
    use_filter, mask = backend.launches[0][5][4:6]
    assert isinstance(use_filter, ctypes.c_int) and use_filter.value == 1
    assert isinstance(mask, ops._ClassMask)
    assert list(mask.words[:3]) == [1, 2, 1 << 15] and not any(mask.words[3:])


@pytest.mark.parametrize(
    ("args", "params", "match"),
    [
        (decode_args(nc=0), PostprocessParams(), "4 \\+ nc"),
        (decode_args(raw_dtype=np.float64), PostprocessParams(), "float32 or float16"),
        (decode_args(max_det=10), PostprocessParams(), r"out must be .* shape \(2, 300, 6\)"),
        (decode_args(), PostprocessParams(top_k=5000), "top_k"),
        (decode_args(nc=2000), PostprocessParams(classes=frozenset({1})), "at most 1024"),
    ],
    ids=["no-classes", "dtype", "out-shape", "top-k", "filter-too-many-classes"],
)
def test_decode_nms_rejects_bad_arguments(
    recorder: tuple[GpuOps, RecordingBackend], args: Any, params: PostprocessParams, match: str
) -> None:
    gpu, backend = recorder
    raw, out, count = args
    with pytest.raises(ValueError, match=match):
        gpu.decode_nms(raw, out, count, params)
    assert not backend.launches and not backend.memsets


def test_decode_nms_checks_count_anchors_and_workspace(
    recorder: tuple[GpuOps, RecordingBackend],
) -> None:
    gpu, _ = recorder
    raw, out, count = decode_args()
    with pytest.raises(ValueError, match="count must be"):
        gpu.decode_nms(raw, out, count.astype(np.int64), PostprocessParams())
    with pytest.raises(ValueError, match="anchors must be"):
        gpu.decode_nms(raw, out, count, PostprocessParams(), anchors=np.zeros((2, 300)))
    with pytest.raises(ValueError, match="workspace must be"):
        gpu.decode_nms(raw, out, count, PostprocessParams(), workspace=np.zeros(16, np.uint8))


def test_decode_nms_empty_batch_launches_nothing(
    recorder: tuple[GpuOps, RecordingBackend],
) -> None:
    gpu, backend = recorder
    gpu.decode_nms(*decode_args(B=0), PostprocessParams())
    assert not backend.launches
