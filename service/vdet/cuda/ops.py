"""GPU letterbox preprocess and decode + NMS: the kernels of vdet/cuda/kernels/ as typed calls.

This module owns the host half of each kernel: validating the caller's tensors, the per-frame
letterbox geometry (`compute_letterbox` on the host, passed to the device as integers, per
docs/conventions.md), the decode + NMS workspace layout and the launch shapes. Tensors are the
caller's (torch, CuPy, anything with __cuda_array_interface__); work is queued on the caller's
stream and nothing here synchronises. How kernels are compiled and launched is
`vdet.cuda.launch`'s business. The numbers the kernels share with the CPU reference (pad
value, YUV -> RGB coefficients, the largest top_k, post-process parameters) are
vdet.core.contract's; like every module of vdet.cuda, this one imports nothing from vdet.inference.

    ops = GpuOps()                                   # compiles for this GPU on first use
    transforms = ops.letterbox_nv12(ys, uvs, batch, matrix="bt709", stream=s)
    ops.letterbox_p016(ys16, uvs16, batch, matrix="bt709", bits=10, stream=s)  # 10-bit video
    ops.decode_nms(raw, dets, counts, PostprocessParams(), stream=s)
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from vdet.core import contract
from vdet.core.contract import (
    CHROMA_OFFSET,
    MAX_TOP_K,
    LetterboxTransform,
    PostprocessParams,
    SampleScale,
    YuvCoefficients,
    compute_letterbox,
    sample_scale,
)
from vdet.core.types import ColourMatrix, ColourRange, ImageArray
from vdet.cuda.launch import Backend, CudaBackend, DeviceArray, KernelArg, stream_handle

# Mirrors of vdet_kernels.h (a test checks that they agree). MAX_TOP_K and the pad value come
# from vdet.core.contract, which also generates their C copy (vdet_contract.h).
MAX_FRAMES = 64
MAX_FILTER_CLASSES = 1024

# Launch shapes and shared-memory layouts from decode_nms.cuh.
DECODE_BLOCK = (32, 8, 1)
SELECT_THREADS = 1024
MASK_THREADS = 256  # 4 threads per candidate row (any 64 * L up to the kernel launch bound)
SCAN_THREADS = 512
SELECT_SMEM_HEADER = 2048 * 4 + 256 * 4 + 64 * 8 + 16 * 4
SCAN_SMEM_HEADER = 64 * 8
SCAN_STATIC_SMEM = 16  # vdet_nms_scan's own __shared__ scalars
LETTERBOX_BLOCK = (32, 8, 1)

YuvMatrix = Literal["bt601", "bt709"]


class _Frame(ctypes.Structure):
    _fields_ = (
        ("plane0", ctypes.c_uint64),
        ("plane1", ctypes.c_uint64),
        ("pitch0", ctypes.c_int),
        ("pitch1", ctypes.c_int),
        ("src_w", ctypes.c_int),
        ("src_h", ctypes.c_int),
        ("new_w", ctypes.c_int),
        ("new_h", ctypes.c_int),
        ("left", ctypes.c_int),
        ("top", ctypes.c_int),
    )


class _FrameBatch(ctypes.Structure):
    _fields_ = (("frames", _Frame * MAX_FRAMES),)


class _YuvCoefficients(ctypes.Structure):
    _fields_ = (
        ("y_offset", ctypes.c_float),
        ("y_scale", ctypes.c_float),
        ("r_v", ctypes.c_float),
        ("g_u", ctypes.c_float),
        ("g_v", ctypes.c_float),
        ("b_u", ctypes.c_float),
    )


class _SampleScale(ctypes.Structure):
    _fields_ = (
        ("shift", ctypes.c_int),
        ("scale", ctypes.c_float),
        ("center", ctypes.c_float),
    )


class _ClassMask(ctypes.Structure):
    _fields_ = (("words", ctypes.c_uint32 * (MAX_FILTER_CLASSES // 32)),)


# ---- YUV ------------------------------------------------------------------------------------


def yuv_coefficients(matrix: YuvMatrix = "bt709", full_range: bool = False) -> YuvCoefficients:
    """vdet.core.contract's coefficients for BT.601 or BT.709, limited (16-235 / 16-240) or full
    (0-255) range, named the way the kernel calls name them."""
    names = sorted(m.value for m in ColourMatrix)
    if matrix not in names:
        raise ValueError(f"matrix must be one of {names}, got {matrix!r}")
    colour_range = ColourRange.FULL if full_range else ColourRange.LIMITED
    return contract.yuv_coefficients(ColourMatrix(matrix), colour_range)


def _yuv_struct(k: YuvCoefficients) -> _YuvCoefficients:
    """vdet_kernels.h's VdetYuvCoefficients, passed to the NV12 kernels by value."""
    return _YuvCoefficients(k.y_offset, k.y_scale, k.r_v, k.g_u, k.g_v, k.b_u)


def nv12_to_bgr(
    y_plane: ImageArray, uv_plane: ImageArray, coefficients: YuvCoefficients
) -> ImageArray:
    """NumPy reference of the kernels' NV12 -> BGR uint8 conversion, bit for bit.

    `y_plane` is (h, w) uint8; `uv_plane` is (ceil(h / 2), ceil(w / 2), 2) or
    (ceil(h / 2), 2 * ceil(w / 2)) uint8. Each pixel takes the chroma pair of its 2 x 2 block.
    """
    y_plane = np.asarray(y_plane, np.uint8)
    h, w = y_plane.shape[:2]
    uv = np.asarray(uv_plane, np.uint8).reshape(uv_plane.shape[0], -1, 2)
    return _yuv8_to_bgr(
        y_plane.reshape(h, w).astype(np.float32), uv.astype(np.float32), coefficients
    )


def p016_to_bgr(
    y_plane: ImageArray,
    uv_plane: ImageArray,
    coefficients: YuvCoefficients,
    scale: SampleScale,
) -> ImageArray:
    """NumPy reference of the kernels' P016 -> BGR uint8 conversion, bit for bit.

    Planes as `nv12_to_bgr`'s with uint16 samples; each sample is brought to the 8-bit scale by
    `scale` (vdet.core.contract.sample_scale), then converted as NV12 is.
    """
    y_plane = np.asarray(y_plane, np.uint16)
    h, w = y_plane.shape[:2]
    uv = np.asarray(uv_plane, np.uint16).reshape(uv_plane.shape[0], -1, 2)
    luma = (y_plane.reshape(h, w) >> scale.shift).astype(np.float32) * np.float32(scale.scale)
    chroma = ((uv >> scale.shift).astype(np.float32) - np.float32(scale.center)) * np.float32(
        scale.scale
    ) + np.float32(CHROMA_OFFSET)
    return _yuv8_to_bgr(luma, chroma, coefficients)


def _yuv8_to_bgr(luma8: np.ndarray, uv8: np.ndarray, k: YuvCoefficients) -> ImageArray:
    """Float32 Y (h, w) and U, V pairs (ceil(h / 2), >= ceil(w / 2), 2) on the 8-bit scale ->
    BGR uint8, each pixel with the chroma pair of its 2 x 2 block."""
    h, w = luma8.shape
    rows, cols = np.arange(h) // 2, np.arange(w) // 2
    u = uv8[rows][:, cols, 0] - np.float32(CHROMA_OFFSET)
    v = uv8[rows][:, cols, 1] - np.float32(CHROMA_OFFSET)
    luma = (luma8 - k.y_offset) * k.y_scale
    r = luma + k.r_v * v
    g = (luma - k.g_u * u) - k.g_v * v
    b = luma + k.b_u * u
    bgr: ImageArray = np.clip(np.rint(np.stack([b, g, r], axis=-1)), 0, 255).astype(np.uint8)
    return bgr


# ---- decode + NMS workspace -----------------------------------------------------------------

_ALIGN = 256


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


@dataclass(frozen=True)
class DecodeNmsLayout:
    """Byte offsets of the decode + NMS scratch buffers inside one workspace allocation."""

    batch: int
    num_anchors: int
    top_k: int
    words: int
    cand_cap: int
    counts: int
    cand_count: int
    keys: int
    best_class: int
    cand_box: int
    cand_score: int
    cand_class: int
    cand_anchor: int
    mask: int
    nbytes: int


def decode_nms_layout(batch: int, num_anchors: int, top_k: int) -> DecodeNmsLayout:
    """The workspace layout for a batch (see decode_nms.cuh for what each buffer holds)."""
    for name, value in (("batch", batch), ("num_anchors", num_anchors), ("top_k", top_k)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    if not 1 <= top_k <= MAX_TOP_K:
        raise ValueError(f"top_k must be in [1, {MAX_TOP_K}] for the GPU kernels, got {top_k}")
    words = (top_k + 63) // 64
    cap = words * 64
    sizes = {
        "counts": 4 * batch,
        "cand_count": 4 * batch,
        "keys": 8 * batch * num_anchors,
        "best_class": 4 * batch * num_anchors,
        "cand_box": 16 * batch * cap,
        "cand_score": 4 * batch * cap,
        "cand_class": 4 * batch * cap,
        "cand_anchor": 4 * batch * cap,
        "mask": 8 * batch * cap * words,
    }
    offsets: dict[str, int] = {}
    at = 0
    for name, size in sizes.items():
        offsets[name] = at
        at += _aligned(size)
    return DecodeNmsLayout(
        batch=batch,
        num_anchors=num_anchors,
        top_k=top_k,
        words=words,
        cand_cap=cap,
        nbytes=at,
        **offsets,
    )


def decode_nms_workspace_bytes(batch: int, num_anchors: int, top_k: int) -> int:
    """Bytes of scratch memory `GpuOps.decode_nms` needs for this batch (for `workspace=`)."""
    return decode_nms_layout(batch, num_anchors, top_k).nbytes


def _pow2_at_least(n: int) -> int:
    p = 1
    while p < n:
        p <<= 1
    return p


def scan_shared_bytes(words: int, max_keep: int, max_shared: int) -> int:
    """vdet_nms_scan's dynamic shared memory: room for the whole mask triangle when the device
    allows it (one load up front), else two row tiles (loaded one ahead while sweeping)."""
    triangle = SCAN_SMEM_HEADER + 8 * 64 * words * (words + 1) // 2 + 4 * max_keep
    if triangle <= max_shared - SCAN_STATIC_SMEM:
        return triangle
    return SCAN_SMEM_HEADER + 2 * 64 * 8 * words + 4 * max_keep


def class_mask(classes: frozenset[int] | None, num_classes: int) -> tuple[bool, _ClassMask]:
    """(use_filter, bitmask) for a class filter; ids >= num_classes can never match."""
    mask = _ClassMask()
    if classes is None:
        return False, mask
    if num_classes > MAX_FILTER_CLASSES:
        raise ValueError(
            f"a class filter supports models of at most {MAX_FILTER_CLASSES} classes on the GPU, "
            f"this one has {num_classes}"
        )
    for class_id in classes:
        if 0 <= class_id < num_classes:
            mask.words[class_id >> 5] |= 1 << (class_id & 31)
    return True, mask


# ---- the operations -------------------------------------------------------------------------


def _u64(ptr: int) -> ctypes.c_uint64:
    return ctypes.c_uint64(ptr)


def _f32(value: float) -> ctypes.c_float:
    return ctypes.c_float(float(np.float32(value)))


def _check_output(out: DeviceArray, frames: int) -> tuple[int, int, str]:
    if len(out.shape) != 4 or out.shape[0] != frames or out.shape[1] != 3:
        raise ValueError(f"out must have shape ({frames}, 3, H, W), got {out.shape}")
    if out.dtype == np.float32:
        suffix = "f32"
    elif out.dtype == np.float16:
        suffix = "f16"
    else:
        raise ValueError(f"out must be float32 or float16, got {out.dtype}")
    if not out.is_contiguous:
        raise ValueError("out must be contiguous (NCHW)")
    H, W = out.shape[2], out.shape[3]
    if H < 1 or W < 1:
        raise ValueError(f"out must have a positive size, got {out.shape}")
    return H, W, suffix


def _check_pitch(pitch: int, row_bytes: int, what: str) -> int:
    if not row_bytes <= pitch < 2**31:
        raise ValueError(f"{what} row pitch must be in [{row_bytes}, 2**31), got {pitch}")
    return pitch


class GpuOps:
    """Letterbox preprocess and decode + NMS on one GPU (or on a test backend)."""

    def __init__(
        self,
        backend: Backend | None = None,
        *,
        device: int = 0,
        cache_dir: Path | None = None,
    ) -> None:
        self.backend: Backend = (
            backend if backend is not None else CudaBackend(device, cache_dir=cache_dir)
        )

    # -- preprocess --

    def letterbox_bgr(
        self, frames: Sequence[object], out: object, *, stream: object = None
    ) -> list[LetterboxTransform]:
        """Letterbox HxWx3 uint8 BGR frames (any row pitch) into `out` [B, 3, H, W].

        Matches `vdet.inference.preprocess.letterbox` (docs/conventions.md): padding and unscaled
        frames bit for bit, resized pixels within 1 / 255. Returns each frame's transform.
        """
        out_view = self.backend.array(out)
        H, W, suffix = _check_output(out_view, len(frames))
        descriptors, transforms = [], []
        for i, frame in enumerate(frames):
            view = self.backend.array(frame)
            if view.dtype != np.uint8 or len(view.shape) != 3 or view.shape[2] != 3:
                raise ValueError(
                    f"frame {i} must be an HxWx3 uint8 tensor, got {view.shape} {view.dtype}"
                )
            h, w = view.shape[0], view.shape[1]
            if view.strides[1:] != (3, 1):
                raise ValueError(f"frame {i} must have packed BGR pixels within each row")
            pitch = _check_pitch(view.strides[0], 3 * w, f"frame {i}")
            transform = compute_letterbox((w, h), (H, W))
            descriptors.append(self._frame(view.ptr, 0, pitch, 0, transform))
            transforms.append(transform)
        self._letterbox(f"vdet_letterbox_bgr_{suffix}", descriptors, [], out_view, stream)
        return transforms

    def letterbox_nv12(
        self,
        y_planes: Sequence[object],
        uv_planes: Sequence[object],
        out: object,
        *,
        matrix: YuvMatrix = "bt709",
        full_range: bool = False,
        stream: object = None,
    ) -> list[LetterboxTransform]:
        """Convert NV12 frames to RGB and letterbox them into `out` [B, 3, H, W].

        Each frame is a Y plane, (h, w) or (h, w, 1) uint8, and an interleaved UV plane,
        (ceil(h/2), 2 * ceil(w/2)) or (ceil(h/2), ceil(w/2), 2) uint8, each with its own row
        pitch (PyNvVideoCodec's planes, or slices of a decoder's (3h/2, w) surface). The result
        equals `nv12_to_bgr` followed by `letterbox`, within the latter's 1 / 255.
        """
        out_view = self.backend.array(out)
        H, W, suffix = _check_output(out_view, len(y_planes))
        descriptors, transforms = self._yuv420_frames(y_planes, uv_planes, (H, W), np.uint8)
        coefficients = yuv_coefficients(matrix, full_range)
        self._letterbox(
            f"vdet_letterbox_nv12_{suffix}",
            descriptors,
            [_yuv_struct(coefficients)],
            out_view,
            stream,
        )
        return transforms

    def letterbox_p016(
        self,
        y_planes: Sequence[object],
        uv_planes: Sequence[object],
        out: object,
        *,
        matrix: YuvMatrix = "bt709",
        full_range: bool = False,
        bits: int = 10,
        stream: object = None,
    ) -> list[LetterboxTransform]:
        """`letterbox_nv12` for P016 frames: the same planes with uint16 samples, each holding a
        `bits`-bit value (9..16) in its high bits (NVDEC's surface for 10- and 12-bit video).
        The result equals `p016_to_bgr` followed by `letterbox`, within the latter's 1 / 255.
        """
        out_view = self.backend.array(out)
        H, W, suffix = _check_output(out_view, len(y_planes))
        colour_range = ColourRange.FULL if full_range else ColourRange.LIMITED
        scale = sample_scale(bits, colour_range)
        descriptors, transforms = self._yuv420_frames(y_planes, uv_planes, (H, W), np.uint16)
        coefficients = yuv_coefficients(matrix, full_range)
        args: list[KernelArg] = [
            _yuv_struct(coefficients),
            _SampleScale(scale.shift, scale.scale, scale.center),
        ]
        self._letterbox(f"vdet_letterbox_p016_{suffix}", descriptors, args, out_view, stream)
        return transforms

    def _yuv420_frames(
        self,
        y_planes: Sequence[object],
        uv_planes: Sequence[object],
        input_hw: tuple[int, int],
        sample: type[np.unsignedinteger],
    ) -> tuple[list[_Frame], list[LetterboxTransform]]:
        """The descriptors of 4:2:0 frames (Y plane, interleaved UV plane) of `sample`s."""
        if len(y_planes) != len(uv_planes):
            raise ValueError(f"got {len(y_planes)} Y planes and {len(uv_planes)} UV planes")
        dtype = np.dtype(sample)
        size = dtype.itemsize
        descriptors, transforms = [], []
        for i, (y_obj, uv_obj) in enumerate(zip(y_planes, uv_planes, strict=True)):
            y, uv = self.backend.array(y_obj), self.backend.array(uv_obj)
            if y.dtype != dtype or len(y.shape) not in (2, 3) or y.shape[2:] not in ((), (1,)):
                raise ValueError(f"Y plane {i} must be (h, w) {dtype}, got {y.shape} {y.dtype}")
            h, w = y.shape[0], y.shape[1]
            if y.strides[1] != size:
                raise ValueError(f"Y plane {i} must have contiguous rows")
            ch, cw = (h + 1) // 2, (w + 1) // 2
            if uv.dtype != dtype:
                raise ValueError(f"UV plane {i} must be {dtype}, got {uv.dtype}")
            if len(uv.shape) == 2:
                pairs, packed = uv.shape[1] // 2, uv.strides[1] == size
            elif len(uv.shape) == 3 and uv.shape[2] == 2:
                pairs, packed = uv.shape[1], uv.strides[1:] == (2 * size, size)
            else:
                raise ValueError(f"UV plane {i} must be (h/2, w) or (h/2, w/2, 2), got {uv.shape}")
            if uv.shape[0] < ch or pairs < cw or not packed:
                raise ValueError(
                    f"UV plane {i} must hold {ch} rows of {cw} packed U,V pairs for a {w}x{h} "
                    f"frame, got shape {uv.shape} strides {uv.strides}"
                )
            transform = compute_letterbox((w, h), input_hw)
            descriptors.append(
                self._frame(
                    y.ptr,
                    uv.ptr,
                    _check_pitch(y.strides[0], w * size, f"Y plane {i}"),
                    _check_pitch(uv.strides[0], 2 * cw * size, f"UV plane {i}"),
                    transform,
                )
            )
            transforms.append(transform)
        return descriptors, transforms

    @staticmethod
    def _frame(
        plane0: int, plane1: int, pitch0: int, pitch1: int, transform: LetterboxTransform
    ) -> _Frame:
        w, h = transform.source_wh
        new_w, new_h = transform.resized_wh
        return _Frame(
            plane0, plane1, pitch0, pitch1, w, h, new_w, new_h, transform.pad_x, transform.pad_y
        )

    def _letterbox(
        self,
        kernel: str,
        descriptors: Sequence[_Frame],
        pixel_args: Sequence[KernelArg],
        out: DeviceArray,
        stream: object,
    ) -> None:
        """Launch `kernel` over `descriptors` (at most MAX_FRAMES a launch); `pixel_args` go
        between the batch and the output (the YUV coefficients, the sample scale)."""
        H, W = out.shape[2], out.shape[3]
        frame_bytes = 3 * H * W * out.dtype.itemsize
        handle = stream_handle(stream)
        for start in range(0, len(descriptors), MAX_FRAMES):
            chunk = descriptors[start : start + MAX_FRAMES]
            batch = _FrameBatch()
            for i, descriptor in enumerate(chunk):
                batch.frames[i] = descriptor
            args: list[KernelArg] = [batch, *pixel_args]
            args += [_u64(out.ptr + start * frame_bytes), ctypes.c_int(H), ctypes.c_int(W)]
            grid = ((W + 31) // 32, (H + 7) // 8, len(chunk))
            self.backend.launch(kernel, grid, LETTERBOX_BLOCK, 0, handle, args)

    # -- decode + NMS --

    def decode_nms(
        self,
        raw: object,
        out: object,
        count: object,
        params: PostprocessParams,
        *,
        anchors: object = None,
        workspace: object = None,
        stream: object = None,
    ) -> None:
        """Decode a raw head [B, 4 + nc, N] (float32 or float16) and run NMS, per image.

        Writes `out` [B, params.max_det, 6] float32 rows (x1, y1, x2, y2, score, class) in
        model-input pixels, best first, zero after the last detection; `count` [B] int32; and,
        when given, `anchors` [B, max_det] int32 (the kept anchor indices, -1 after the last).
        The same detections, in the same order, as `decode_and_nms_image` (docs/conventions.md).
        `workspace` (uint8, at least `decode_nms_workspace_bytes` long) saves a stream-ordered
        allocation per call; without it one is made and freed on `stream`.
        """
        backend = self.backend
        raw_v, out_v, count_v = backend.array(raw), backend.array(out), backend.array(count)
        if len(raw_v.shape) != 3 or raw_v.shape[1] < 5:
            raise ValueError(f"raw must have shape (B, 4 + nc, N) with nc >= 1, got {raw_v.shape}")
        if raw_v.dtype not in (np.float32, np.float16):
            raise ValueError(f"raw must be float32 or float16, got {raw_v.dtype}")
        if not raw_v.is_contiguous:
            raise ValueError("raw must be contiguous")
        B, rows, N = raw_v.shape
        nc = rows - 4
        max_det = params.max_det
        self._check_tensor(out_v, "out", (B, max_det, 6), np.float32)
        self._check_tensor(count_v, "count", (B,), np.int32)
        anchors_v = None
        if anchors is not None:
            anchors_v = backend.array(anchors)
            self._check_tensor(anchors_v, "anchors", (B, max_det), np.int32)
        if B > 65535:
            raise ValueError(f"batch must be at most 65535 images, got {B}")
        if rows * N >= 2**31:
            raise ValueError(f"head too large for 32-bit indexing: {raw_v.shape}")
        layout = decode_nms_layout(B, N, params.top_k)
        use_filter, mask = class_mask(params.classes, nc)
        if B == 0:
            return

        handle = stream_handle(stream)
        if workspace is not None:
            ws = backend.array(workspace)
            if not ws.is_contiguous or ws.nbytes < layout.nbytes:
                raise ValueError(
                    f"workspace must be a contiguous buffer of at least {layout.nbytes} bytes, "
                    f"got {ws.nbytes}"
                )
            self._decode_nms(
                raw_v, out_v, count_v, anchors_v, params, layout, use_filter, mask, ws.ptr, handle
            )
            return
        base = backend.alloc(layout.nbytes, handle)
        try:
            self._decode_nms(
                raw_v, out_v, count_v, anchors_v, params, layout, use_filter, mask, base, handle
            )
        finally:
            backend.free(base, handle)

    @staticmethod
    def _check_tensor(
        view: DeviceArray, name: str, shape: tuple[int, ...], dtype: type[np.generic]
    ) -> None:
        if view.shape != shape or view.dtype != dtype or not view.is_contiguous:
            raise ValueError(
                f"{name} must be a contiguous {np.dtype(dtype).name} tensor of shape {shape}, "
                f"got {view.shape} {view.dtype}"
            )

    def _decode_nms(
        self,
        raw: DeviceArray,
        out: DeviceArray,
        count: DeviceArray,
        anchors: DeviceArray | None,
        params: PostprocessParams,
        layout: DecodeNmsLayout,
        use_filter: bool,
        mask: _ClassMask,
        base: int,
        stream: int,
    ) -> None:
        backend = self.backend
        B, rows, N = raw.shape
        nc = rows - 4
        suffix = "f32" if raw.dtype == np.float32 else "f16"
        at = {
            name: _u64(base + getattr(layout, name))
            for name in (
                "counts",
                "cand_count",
                "keys",
                "best_class",
                "cand_box",
                "cand_score",
                "cand_class",
                "cand_anchor",
                "mask",
            )
        }
        top_k, words, cap = params.top_k, layout.words, layout.cand_cap
        i32 = ctypes.c_int

        backend.memset_u32(base + layout.counts, 0, B, stream)
        backend.launch(
            f"vdet_decode_candidates_{suffix}",
            (max(1, (N + 31) // 32), B, 1),
            DECODE_BLOCK,
            0,
            stream,
            [
                _u64(raw.ptr),
                i32(nc),
                i32(N),
                _f32(params.conf_threshold),
                i32(int(use_filter)),
                mask,
                at["counts"],
                at["keys"],
                at["best_class"],
            ],
        )

        select_fixed = SELECT_SMEM_HEADER + 8 * _pow2_at_least(top_k)
        stage_cap = max(0, min(N, (backend.max_shared_bytes - select_fixed) // 8))
        backend.launch(
            f"vdet_select_topk_{suffix}",
            (B, 1, 1),
            (SELECT_THREADS, 1, 1),
            select_fixed + 8 * stage_cap,
            stream,
            [
                _u64(raw.ptr),
                i32(nc),
                i32(N),
                i32(top_k),
                _f32(params.conf_threshold),
                i32(stage_cap),
                at["counts"],
                at["keys"],
                at["best_class"],
                i32(cap),
                at["cand_count"],
                at["cand_box"],
                at["cand_score"],
                at["cand_class"],
                at["cand_anchor"],
            ],
        )

        backend.launch(
            "vdet_nms_mask",
            (words, words, B),
            (MASK_THREADS, 1, 1),
            0,
            stream,
            [
                at["cand_count"],
                at["cand_box"],
                at["cand_class"],
                i32(cap),
                i32(words),
                _f32(params.iou_threshold),
                i32(int(params.class_agnostic)),
                at["mask"],
            ],
        )

        max_keep = min(params.max_det, cap)
        backend.launch(
            "vdet_nms_scan",
            (B, 1, 1),
            (SCAN_THREADS, 1, 1),
            scan_shared_bytes(words, max_keep, backend.max_shared_bytes),
            stream,
            [
                at["cand_count"],
                at["cand_box"],
                at["cand_score"],
                at["cand_class"],
                at["cand_anchor"],
                i32(cap),
                i32(words),
                at["mask"],
                i32(params.max_det),
                i32(max_keep),
                _u64(out.ptr),
                _u64(count.ptr),
                _u64(anchors.ptr if anchors is not None else 0),
            ],
        )
