"""The two per-frame GPU ops around the network, their interface, and pure-torch references.

This module owns what a CUDA-graph runner launches besides the network: NV12 -> letterboxed RGB
(`PreprocessFn`) and raw head -> decode + NMS (`DecodeNmsFn`), the `Nv12Geometry` a preprocess
launch needs, and reference implementations of both ops written with plain torch ops. The YUV ->
RGB coefficients, the pad value and the letterbox geometry they use are vdet.core.contract's. The
references run on any device (CPU included, which is how they are tested against the CPU
pipeline) and are capturable in a CUDA graph: fixed shapes, no host synchronisation, no host ->
device copies once `prepare_decode_nms` has run outside capture. The CUDA kernels (vdet.cuda)
implement the same callables; the runner takes whichever it is given. This module must not know
about streams of sources, caches of graphs or models.

Preprocess contract (NV12 in, as the kernels in vdet/cuda/kernels/preprocess.cuh specify it):
each source pixel is converted with its nearest chroma sample (the 2 x 2 block's U, V) by
``y = (Y - y_offset) * y_scale; u = U - 128; v = V - 128; R = y + r_v * v;
G = (y - g_u * u) - g_v * v; B = y + b_u * u``, each product and sum rounded to float32, then
rounded to the nearest integer (ties to even) and clamped to [0, 255]: an 8-bit RGB image, as a
CPU decoder would hand over. From there it is the CPU `letterbox` (docs/conventions.md):
bilinear resize with half-pixel centres when the size changes (result rounded half up to
uint8, as OpenCV's fixed point does), pad `PAD_VALUE`, divide by 255. Against `letterbox` applied to
the same 8-bit BGR image: padding and frames that need no resize are exact; resized areas are
within 1 / 255 (float weights against OpenCV's 11-bit fixed-point ones).

Decode + NMS contract: `decode_and_nms_image` (docs/conventions.md) per image; output rows are
``x1, y1, x2, y2, score, class_id`` in model-input pixels, best first, then zeros; the count per
image is written to `out_count`. A count of -1 means the implementation could not prove its
result exact within its fixed work and the caller must run the host reference on that image
(the reference below can, for pathological suppression chains; the CUDA kernel never does).
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from torch.nn import functional

from vdet.core.contract import (
    CHROMA_OFFSET,
    PAD_VALUE,
    UNIT_SCALE,
    LetterboxTransform,
    PostprocessParams,
    compute_letterbox,
    float32,
    sample_scale,
    yuv_coefficients,
)
from vdet.core.types import ColourMatrix, ColourRange, FloatArray, IntArray
from vdet.cuda.cuda_stream import on_stream

# Columns of a decode + NMS output row.
DETECTION_COLUMNS = 6


@dataclass(frozen=True)
class Nv12Geometry:
    """Everything a preprocess launch needs besides the pixels: sizes, letterbox, colour, and
    the surface's sample depth.

    Frozen and hashable: runners key their captured graphs by it. `new_wh`, `left`, `top` come
    from `compute_letterbox` on the host, never recomputed on the device. `bits` 8 is an NV12
    surface (uint8); 9..16 a P016 one (NVDEC's for 10- and 12-bit video: the same layout with
    uint16 samples, each `bits`-bit value in the high bits).
    """

    source_wh: tuple[int, int]
    input_hw: tuple[int, int]
    new_wh: tuple[int, int]
    left: int
    top: int
    matrix: ColourMatrix
    colour_range: ColourRange
    bits: int = 8

    def __post_init__(self) -> None:
        w, h = self.source_wh
        if w < 2 or h < 2 or w % 2 or h % 2:
            raise ValueError(f"NV12 frames have even sizes of at least 2, got {w}x{h}")
        if not 8 <= self.bits <= 16:
            raise ValueError(f"surfaces hold 8- to 16-bit samples, got {self.bits} bits")

    @classmethod
    def of(
        cls,
        source_wh: tuple[int, int],
        input_hw: tuple[int, int],
        matrix: ColourMatrix = ColourMatrix.BT709,
        colour_range: ColourRange = ColourRange.LIMITED,
        bits: int = 8,
    ) -> Nv12Geometry:
        # Every frame asks; a stream has one geometry (per resolution): computed once.
        return _geometry(
            (int(source_wh[0]), int(source_wh[1])),
            (int(input_hw[0]), int(input_hw[1])),
            ColourMatrix(matrix),
            ColourRange(colour_range),
            int(bits),
        )

    @property
    def transform(self) -> LetterboxTransform:
        """The CPU `LetterboxTransform` of this geometry, to map boxes back to source pixels."""
        return _letterbox(self.source_wh, self.input_hw)

    @property
    def nv12_shape(self) -> tuple[int, int]:
        """(rows, columns) of the frame's NV12 (or P016) buffer: h luma rows, then h / 2 rows
        of UV."""
        w, h = self.source_wh
        return h * 3 // 2, w

    @property
    def surface_dtype(self) -> torch.dtype:
        """uint8 for NV12, uint16 for P016."""
        return torch.uint8 if self.bits == 8 else torch.uint16


@functools.lru_cache(maxsize=256)
def _letterbox(source_wh: tuple[int, int], input_hw: tuple[int, int]) -> LetterboxTransform:
    return compute_letterbox(source_wh, input_hw)


@functools.lru_cache(maxsize=256)
def _geometry(
    source_wh: tuple[int, int],
    input_hw: tuple[int, int],
    matrix: ColourMatrix,
    colour_range: ColourRange,
    bits: int,
) -> Nv12Geometry:
    t = _letterbox(source_wh, input_hw)
    return Nv12Geometry(
        source_wh=source_wh,
        input_hw=t.input_hw,
        new_wh=t.resized_wh,
        left=t.pad_x,
        top=t.pad_y,
        matrix=matrix,
        colour_range=colour_range,
        bits=bits,
    )


class PreprocessFn(Protocol):
    """Letterbox one NV12 (or P016) frame into one network input slot, enqueued on `stream`.

    `nv12`: (h * 3 / 2, w) of `geometry.surface_dtype` on the device (rows may be padded: any
    row stride);
    `out`: (3, H, W) float16 or float32 view of the network input; nothing else is written.
    `stream` is the torch stream the launch goes on (None: the current stream).
    """

    def __call__(
        self,
        nv12: torch.Tensor,
        geometry: Nv12Geometry,
        out: torch.Tensor,
        stream: torch.cuda.Stream | None,
    ) -> None: ...


class DecodeNmsFn(Protocol):
    """Decode + NMS a batch of raw heads into fixed-size outputs, enqueued on `stream`.

    `raw`: (B, 4 + nc, N) float16 or float32; `out_boxes`: (B, max_det, 6) float32, rows
    x1, y1, x2, y2, score, class_id, best first, unused rows zero; `out_count`: (B,) int32, or
    -1 for an image the caller must redo with the host reference (module docstring).
    """

    def __call__(
        self,
        raw: torch.Tensor,
        params: PostprocessParams,
        out_boxes: torch.Tensor,
        out_count: torch.Tensor,
        stream: torch.cuda.Stream | None,
    ) -> None: ...


# ------------------------------------------------------------------------------ preprocess


def surface_to_rgb_u8(surface: torch.Tensor, geometry: Nv12Geometry) -> torch.Tensor:
    """`nv12_to_rgb_u8` or `p016_to_rgb_u8`, as `geometry.bits` says."""
    if geometry.bits == 8:
        return nv12_to_rgb_u8(surface, geometry)
    return p016_to_rgb_u8(surface, geometry)


def nv12_to_rgb_u8(nv12: torch.Tensor, geometry: Nv12Geometry) -> torch.Tensor:
    """(3, h, w) float32 RGB holding integers 0..255: the 8-bit image a CPU decoder would give."""
    w, h = geometry.source_wh
    if nv12.dim() != 2 or tuple(nv12.shape) != geometry.nv12_shape or nv12.dtype != torch.uint8:
        raise ValueError(
            f"nv12 must be {geometry.nv12_shape} uint8 for a {w}x{h} frame, "
            f"got {tuple(nv12.shape)} {nv12.dtype}"
        )
    planes = nv12.float()
    return _yuv8_to_rgb_u8(planes[:h], planes[h:], geometry)


def p016_to_rgb_u8(p016: torch.Tensor, geometry: Nv12Geometry) -> torch.Tensor:
    """(3, h, w) float32 RGB holding integers 0..255 from a 16-bit 4:2:0 surface (P016: NVDEC's
    output for 10- and 12-bit video, each `geometry.bits`-bit sample in the high bits of 16; Y
    rows, then interleaved U, V rows), the 8-bit image a CPU decoder would give.

    Samples are brought to the 8-bit scale first (vdet.core.contract.sample_scale: limited
    range divides by 2^(bits-8), so luma 64..940 at 10 bits is 16..235; full range maps
    0..2^bits-1 to 0..255 with chroma centred on 2^(bits-1), ITU-R BT.2100's full-range
    quantisation), then converted as NV12 is.
    """
    w, h = geometry.source_wh
    bits = geometry.bits
    if (
        p016.dim() != 2
        or tuple(p016.shape) != geometry.nv12_shape
        or p016.dtype != torch.uint16
        or not 8 < bits <= 16
    ):
        raise ValueError(
            f"p016 must be {geometry.nv12_shape} uint16 for a {w}x{h} frame and bits 9..16, "
            f"got {tuple(p016.shape)} {p016.dtype}, bits {bits}"
        )
    scale = sample_scale(bits, geometry.colour_range)
    samples = (p016.to(torch.int32) >> scale.shift).float()
    luma = samples[:h] * scale.scale
    chroma = (samples[h:] - scale.center) * scale.scale + float(CHROMA_OFFSET)
    return _yuv8_to_rgb_u8(luma, chroma, geometry)


def _yuv8_to_rgb_u8(
    luma: torch.Tensor, chroma: torch.Tensor, geometry: Nv12Geometry
) -> torch.Tensor:
    """Float Y (h, w) and interleaved U, V (h / 2, w) on the 8-bit scale -> rounded RGB."""
    w, h = geometry.source_wh
    k = yuv_coefficients(geometry.matrix, geometry.colour_range)
    luma = (luma - k.y_offset) * k.y_scale
    uv = chroma.reshape(h // 2, 1, w // 2, 1, 2) - float(CHROMA_OFFSET)
    # Nearest chroma: every 2 x 2 block of luma shares its U, V sample. (expand, not
    # repeat_interleave, whose CUDA kernel may size its output on the host: no capture.)
    uv = uv.expand(h // 2, 2, w // 2, 2, 2).reshape(h, w, 2)
    u, v = uv[..., 0], uv[..., 1]
    r = luma + k.r_v * v
    g = (luma - k.g_u * u) - k.g_v * v
    b = luma + k.b_u * u
    return torch.stack((r, g, b)).round_().clamp_(0.0, 255.0)


def nv12_letterbox_reference(
    nv12: torch.Tensor,
    geometry: Nv12Geometry,
    out: torch.Tensor,
    stream: torch.cuda.Stream | None = None,
) -> None:
    """`PreprocessFn` in torch ops: NV12 (or P016) -> 8-bit RGB -> the CPU letterbox, into
    `out`."""
    H, W = geometry.input_hw
    if tuple(out.shape) != (3, H, W):
        raise ValueError(f"out must have shape (3, {H}, {W}), got {tuple(out.shape)}")
    with on_stream(stream):
        rgb = surface_to_rgb_u8(nv12, geometry)
        new_w, new_h = geometry.new_wh
        if (new_w, new_h) != geometry.source_wh:
            rgb = functional.interpolate(
                rgb[None], size=(new_h, new_w), mode="bilinear", align_corners=False
            )[0]
            rgb = torch.floor(rgb + 0.5).clamp_(0.0, 255.0)
        out.fill_(float(np.float32(PAD_VALUE) / np.float32(UNIT_SCALE)))
        left, top = geometry.left, geometry.top
        out[:, top : top + new_h, left : left + new_w] = rgb / 255.0


# ----------------------------------------------------------------------------- decode + NMS


@dataclass(frozen=True)
class _NmsConstants:
    class_mask: torch.Tensor | None  # (nc,) bool, True for wanted classes
    later: torch.Tensor  # (K, K) bool, [i, j] is True when candidate i comes before j


class ReferenceDecodeNms:
    """`DecodeNmsFn` in torch ops with fixed shapes, so that a CUDA graph can capture it.

    Greedy NMS is sequential; here it is solved as the fixed point of ``keep = valid & ~(any
    earlier kept box overlaps)`` by `iterations` parallel sweeps (each sweep fixes at least one
    more link of the longest suppression chain). One more sweep checks the result: when it
    changes nothing the result *is* greedy NMS's (the fixed point is unique); otherwise that
    image's count is -1 and the caller redoes it on the host. Real detections need 2-4 sweeps.

    Device constants (class filter, candidate order) are made on the first call for each
    (params, shape, device): make that call outside CUDA graph capture (`prepare`).
    """

    def __init__(self, iterations: int = 8) -> None:
        if iterations < 1:
            raise ValueError(f"iterations must be at least 1, got {iterations}")
        self.iterations = iterations
        self._lock = threading.Lock()
        self._constants: dict[tuple[object, ...], _NmsConstants] = {}

    def prepare(self, raw: torch.Tensor, params: PostprocessParams) -> None:
        """Create the device constants for this raw shape and params (not during capture)."""
        self._get_constants(raw, params)

    def _get_constants(self, raw: torch.Tensor, params: PostprocessParams) -> _NmsConstants:
        nc, n = raw.shape[1] - 4, raw.shape[2]
        k = min(params.top_k, n)
        key = (params.classes, nc, k, raw.device)
        with self._lock:
            found = self._constants.get(key)
            if found is None:
                mask = None
                if params.classes is not None:
                    wanted = [c for c in params.classes if c < nc]
                    mask = torch.zeros(nc, dtype=torch.bool, device=raw.device)
                    if wanted:
                        mask[torch.tensor(wanted, dtype=torch.long, device=raw.device)] = True
                later = torch.ones(k, k, dtype=torch.bool, device=raw.device).triu_(diagonal=1)
                found = self._constants[key] = _NmsConstants(mask, later)
        return found

    def __call__(
        self,
        raw: torch.Tensor,
        params: PostprocessParams,
        out_boxes: torch.Tensor,
        out_count: torch.Tensor,
        stream: torch.cuda.Stream | None = None,
    ) -> None:
        if raw.dim() != 3 or raw.shape[1] < 5:
            raise ValueError(f"raw must have shape (B, 4 + nc, N), got {tuple(raw.shape)}")
        B, _, N = raw.shape
        max_det = params.max_det
        if tuple(out_boxes.shape) != (B, max_det, DETECTION_COLUMNS):
            raise ValueError(
                f"out_boxes must have shape ({B}, {max_det}, 6), got {tuple(out_boxes.shape)}"
            )
        if tuple(out_count.shape) != (B,):
            raise ValueError(f"out_count must have shape ({B},), got {tuple(out_count.shape)}")
        if N == 0:
            out_boxes.zero_()
            out_count.zero_()
            return
        constants = self._get_constants(raw, params)
        with on_stream(stream):
            self._run(raw.float(), params, constants, out_boxes, out_count)

    def _run(
        self,
        raw: torch.Tensor,
        params: PostprocessParams,
        constants: _NmsConstants,
        out_boxes: torch.Tensor,
        out_count: torch.Tensor,
    ) -> None:
        B = raw.shape[0]
        K = constants.later.shape[0]
        # Best class per anchor; max over classes returns the first (lowest) index on ties and
        # NaN when any score is NaN, which then fails the strict threshold test.
        best, class_ids = raw[:, 4:, :].max(dim=1)
        valid = best > float32(params.conf_threshold)
        if constants.class_mask is not None:
            valid &= constants.class_mask[class_ids]
        ranked = torch.where(valid, best, torch.full_like(best, float("-inf")))
        # Stable: equal scores keep anchor order, as the reference's stable argsort does.
        scores, order = torch.sort(ranked, dim=1, descending=True, stable=True)
        scores, order = scores[:, :K], order[:, :K]
        candidate = scores > float("-inf")
        cls = torch.gather(class_ids, 1, order)
        xywh = torch.gather(raw[:, :4, :], 2, order[:, None, :].expand(B, 4, K))
        half_w, half_h = xywh[:, 2] / 2.0, xywh[:, 3] / 2.0
        x1, y1 = xywh[:, 0] - half_w, xywh[:, 1] - half_h
        x2, y2 = xywh[:, 0] + half_w, xywh[:, 1] + half_h

        # IoU of every candidate pair, in the reference's float32 order of operations.
        right = torch.minimum(x2[:, :, None], x2[:, None, :])
        iw = (right - torch.maximum(x1[:, :, None], x1[:, None, :])).clamp_(min=0.0)
        bottom = torch.minimum(y2[:, :, None], y2[:, None, :])
        ih = (bottom - torch.maximum(y1[:, :, None], y1[:, None, :])).clamp_(min=0.0)
        inter = iw * ih
        area = (x2 - x1) * (y2 - y1)
        union = (area[:, :, None] + area[:, None, :]) - inter
        positive = union > 0
        iou = torch.where(positive, inter / torch.where(positive, union, 1.0), 0.0)
        # suppresses[b, i, j]: candidate i, if kept, removes the later candidate j.
        suppresses = (iou > float32(params.iou_threshold)) & constants.later
        if not params.class_agnostic:
            suppresses &= cls[:, :, None] == cls[:, None, :]
        suppresses &= candidate[:, :, None]

        keep = candidate
        for _ in range(self.iterations):
            keep = candidate & ~(keep[:, :, None] & suppresses).any(dim=1)
        again = candidate & ~(keep[:, :, None] & suppresses).any(dim=1)
        exact = (again == keep).all(dim=1)

        rank = keep.long().cumsum(dim=1) - 1
        chosen = keep & (rank < params.max_det)
        rows = torch.stack((x1, y1, x2, y2, scores, cls.float()), dim=2)
        slot = torch.where(chosen, rank, torch.full_like(rank, params.max_det))
        staged = torch.zeros(
            B, params.max_det + 1, DETECTION_COLUMNS, dtype=torch.float32, device=raw.device
        )
        staged.scatter_(1, slot[:, :, None].expand(B, K, DETECTION_COLUMNS), rows)
        out_boxes.copy_(staged[:, : params.max_det])
        count = chosen.sum(dim=1)
        out_count.copy_(torch.where(exact, count, torch.full_like(count, -1)))


def kernel_ops(device: int = 0) -> tuple[PreprocessFn, DecodeNmsFn]:
    """The CUDA kernels of vdet.cuda (NVRTC-compiled on first use) as the runner's two ops.

    Raises ImportError / RuntimeError where they cannot run (no cuda-python, no GPU). Each
    calling stream gets its own decode + NMS workspace, made on the first (eager, warm-up)
    call, so the captured launches allocate nothing and sources never share scratch memory.
    """
    from vdet.cuda.launch import stream_handle
    from vdet.cuda.ops import GpuOps, decode_nms_workspace_bytes

    ops = GpuOps(device=device)
    workspaces: dict[tuple[int, int, int, int], torch.Tensor] = {}
    lock = threading.Lock()

    def preprocess(
        nv12: torch.Tensor,
        geometry: Nv12Geometry,
        out: torch.Tensor,
        stream: torch.cuda.Stream | None,
    ) -> None:
        h = geometry.source_wh[1]
        full_range = geometry.colour_range is ColourRange.FULL
        if geometry.bits == 8:
            ops.letterbox_nv12(
                [nv12[:h]],
                [nv12[h:]],
                out[None],
                matrix=geometry.matrix.value,
                full_range=full_range,
                stream=stream,
            )
        else:
            ops.letterbox_p016(
                [nv12[:h]],
                [nv12[h:]],
                out[None],
                matrix=geometry.matrix.value,
                full_range=full_range,
                bits=geometry.bits,
                stream=stream,
            )

    def decode_nms(
        raw: torch.Tensor,
        params: PostprocessParams,
        out_boxes: torch.Tensor,
        out_count: torch.Tensor,
        stream: torch.cuda.Stream | None,
    ) -> None:
        batch, _, anchors = raw.shape
        key = (batch, anchors, params.top_k, stream_handle(stream))
        with lock:
            workspace = workspaces.get(key)
            if workspace is None:
                size = decode_nms_workspace_bytes(batch, anchors, params.top_k)
                with on_stream(stream):
                    workspace = torch.empty(size, dtype=torch.uint8, device=raw.device)
                workspaces[key] = workspace
        ops.decode_nms(
            raw.contiguous(), out_boxes, out_count, params, workspace=workspace, stream=stream
        )

    return preprocess, decode_nms


def rows_to_arrays(rows: FloatArray, count: int) -> tuple[FloatArray, FloatArray, IntArray]:
    """Split the first `count` output rows into (xyxy float32, scores float32, class ids int32)."""
    kept = np.asarray(rows[:count], dtype=np.float32)
    return (
        np.ascontiguousarray(kept[:, :4]),
        np.ascontiguousarray(kept[:, 4]),
        kept[:, 5].astype(np.int32),
    )


__all__ = [
    "DETECTION_COLUMNS",
    "DecodeNmsFn",
    "Nv12Geometry",
    "PreprocessFn",
    "ReferenceDecodeNms",
    "kernel_ops",
    "nv12_letterbox_reference",
    "nv12_to_rgb_u8",
    "p016_to_rgb_u8",
    "rows_to_arrays",
    "surface_to_rgb_u8",
]
