"""The numeric contract of detection: the single source of every number its implementations share.

This module owns the numbers and the small pure rules that the CPU reference (vdet.inference), the
CUDA kernels and their NVRTC launcher (vdet.cuda), the TensorRT build (vdet.modelkit), the
settings (vdet.config) and the CLI must agree on bit for bit:

* model input: the default network input size and stride of the models vdet exports and trains;
* letterbox geometry: `compute_letterbox` and the `LetterboxTransform` it returns (scale, padding,
  the way back to source pixels), the rectangular input that holds a frame (`rect_input_hw`)
  and the pad value;
* YUV -> RGB: each matrix's luma weights, the limited-range offsets and gains, and the float32
  coefficients the kernels receive as a launch argument (`yuv_coefficients`);
* post-process: `PostprocessParams`, the serving defaults (`CONF_THRESHOLD`, `IOU_THRESHOLD`,
  `TOP_K`, `MAX_DET`, `CLASS_AGNOSTIC`), the evaluation parameters (`EVAL_*`), and the largest
  `top_k` the GPU kernels accept (`MAX_TOP_K`).

Anything else that needs one of these numbers imports it from here; a literal copy elsewhere is a
second source that can drift. docs/conventions.md states the rules in prose for kernel authors.

C and CUDA cannot import Python, so their copy is generated: `vdet.cuda.contract_header`
writes vdet/cuda/kernels/vdet_contract.h from this module, the kernels and the TensorRT plugin
include it, and a test fails when the committed header differs from what the generator writes
now. A generated header was chosen over a test that parses hand-written C++ literals because the
C side then holds no number of its own to keep in step: changing a value here and re-running the
generator is the whole change, and the test names the command when it was forgotten.

This module imports nothing from the pipeline, the kernels or the engines (they import it), and
it does no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from vdet.core.types import ColourMatrix, ColourRange, FloatArray

# ---- model input ----------------------------------------------------------------------------

# Square network input of the models `vdet export` and `vdet train` make (Ultralytics' imgsz).
INPUT_SIZE = 640
# YOLOv8's largest feature stride; a model's metadata may state another one.
STRIDE = 32

# ---- letterbox ------------------------------------------------------------------------------

# Value of the padding around the resized image, as uint8 before normalisation (Ultralytics').
PAD_VALUE = 114
# Input values are uint8 / UNIT_SCALE, as an IEEE float32 division.
UNIT_SCALE = 255


@dataclass(frozen=True)
class LetterboxTransform:
    """How one source image was placed in the network input, and how to map boxes back.

    `gain` is r = min(H / h, W / w); `pad_x` / `pad_y` are the left / top padding in input pixels;
    `input_hw` is the network input (H, W); `source_wh` is the source image (w, h). The exact
    per-axis scale actually applied by the resize is `scale_xy` (within 0.5 / w of `gain`).
    """

    gain: float
    pad_x: int
    pad_y: int
    input_hw: tuple[int, int]
    source_wh: tuple[int, int]

    @property
    def resized_wh(self) -> tuple[int, int]:
        """Size of the image inside the padding, in input pixels."""
        return resized_size(self.source_wh, self.gain)

    @property
    def scale_xy(self) -> tuple[float, float]:
        """Input pixels per source pixel along x and y, exactly as the resize applied them."""
        (new_w, new_h), (w, h) = self.resized_wh, self.source_wh
        return new_w / w, new_h / h

    def to_source(self, xyxy: FloatArray) -> FloatArray:
        """Map (n, 4) xyxy boxes from input pixels to source pixels, clipped to the image."""
        boxes = self._check_boxes(xyxy)
        scale_x, scale_y = self.scale_xy
        out = np.empty_like(boxes)
        out[:, 0::2] = (boxes[:, 0::2] - np.float32(self.pad_x)) / np.float32(scale_x)
        out[:, 1::2] = (boxes[:, 1::2] - np.float32(self.pad_y)) / np.float32(scale_y)
        w, h = self.source_wh
        np.clip(out[:, 0::2], 0, w, out=out[:, 0::2])
        np.clip(out[:, 1::2], 0, h, out=out[:, 1::2])
        return out

    def to_input(self, xyxy: FloatArray) -> FloatArray:
        """Map (n, 4) xyxy boxes from source pixels to input pixels (no clipping)."""
        boxes = self._check_boxes(xyxy)
        scale_x, scale_y = self.scale_xy
        out = np.empty_like(boxes)
        out[:, 0::2] = boxes[:, 0::2] * np.float32(scale_x) + np.float32(self.pad_x)
        out[:, 1::2] = boxes[:, 1::2] * np.float32(scale_y) + np.float32(self.pad_y)
        return out

    @staticmethod
    def _check_boxes(xyxy: FloatArray) -> FloatArray:
        boxes = np.asarray(xyxy, dtype=np.float32)
        if boxes.ndim != 2 or boxes.shape[1] != 4:
            raise ValueError(f"boxes must have shape (n, 4), got {boxes.shape}")
        return boxes


def letterbox_gain(source_wh: tuple[int, int], input_hw: tuple[int, int]) -> float:
    """r = min(H / h, W / w) in float64: images are scaled up as well as down."""
    (w, h), (H, W) = source_wh, input_hw
    return min(H / h, W / w)


def resized_size(source_wh: tuple[int, int], gain: float) -> tuple[int, int]:
    """(new_w, new_h) = (max(round(w * r), 1), max(round(h * r), 1)), Python's round."""
    w, h = source_wh
    return max(round(w * gain), 1), max(round(h * gain), 1)


def letterbox_padding(resized_wh: tuple[int, int], input_hw: tuple[int, int]) -> tuple[int, int]:
    """(left, top) padding: Ultralytics' asymmetric rounding puts an odd pixel right / bottom."""
    (new_w, new_h), (H, W) = resized_wh, input_hw
    return round((W - new_w) / 2 - 0.1), round((H - new_h) / 2 - 0.1)


def compute_letterbox(source_wh: tuple[int, int], input_hw: tuple[int, int]) -> LetterboxTransform:
    """The letterbox geometry for a source size; the GPU paths call this on the host too."""
    w, h = source_wh
    H, W = input_hw
    if w < 1 or h < 1:
        raise ValueError(f"source size must be positive, got {source_wh}")
    if H < 1 or W < 1:
        raise ValueError(f"input size must be positive, got {input_hw}")
    gain = letterbox_gain((w, h), (H, W))
    pad_x, pad_y = letterbox_padding(resized_size((w, h), gain), (H, W))
    return LetterboxTransform(
        gain=gain,
        pad_x=pad_x,
        pad_y=pad_y,
        input_hw=(int(H), int(W)),
        source_wh=(int(w), int(h)),
    )


def rect_input_hw(
    source_wh: tuple[int, int], input_hw: tuple[int, int], stride: int
) -> tuple[int, int]:
    """The smallest network input, sides multiples of `stride`, that holds `source_wh`
    letterboxed at the scale it gets in `input_hw`: (384, 640) for 1920x1080 or 1280x720 at
    640x640, (480, 640) for 4:3 (a rectangular input, for backends that take one)."""
    w, h = source_wh
    H, W = input_hw
    if w < 1 or h < 1:
        raise ValueError(f"source size must be positive, got {source_wh}")
    if stride < 1 or H % stride or W % stride:
        raise ValueError(f"input size {input_hw} must be a multiple of the stride {stride}")
    new_w, new_h = resized_size((w, h), letterbox_gain((w, h), (H, W)))
    return min(-(-new_h // stride) * stride, H), min(-(-new_w // stride) * stride, W)


# ---- YUV -> RGB -----------------------------------------------------------------------------

# (Kr, Kb) luma weights of each matrix (ITU-R BT.601 and BT.709); Kg = 1 - Kr - Kb.
LUMA_WEIGHTS: Mapping[ColourMatrix, tuple[float, float]] = MappingProxyType(
    {
        ColourMatrix.BT601: (0.299, 0.114),
        ColourMatrix.BT709: (0.2126, 0.0722),
    }
)
# 8-bit chroma is stored offset by 128 (u = U - 128, v = V - 128) in either range.
CHROMA_OFFSET = 128
# Limited ("MPEG", "tv") range: luma 16..235 (219 steps), chroma 16..240 (224 steps).
LIMITED_LUMA_OFFSET = 16
LIMITED_LUMA_STEPS = 219
LIMITED_CHROMA_STEPS = 224


def float32(value: float) -> float:
    """`value` rounded to the nearest float32, as a Python float (exact in float32 ops)."""
    return float(np.float32(value))


@dataclass(frozen=True)
class YuvCoefficients:
    """The float32 constants of the YUV -> RGB conversion, each a Python float exact in float32.

    Per pixel, in float32 and in this order (the kernels' VdetYuvCoefficients, the NumPy and
    torch references): ``y = (Y - y_offset) * y_scale; u = U - 128; v = V - 128;
    R = y + r_v * v; G = (y - g_u * u) - g_v * v; B = y + b_u * u``, then each channel rounded
    to the nearest integer (ties to even) and clamped to [0, 255].
    """

    y_offset: float
    y_scale: float
    r_v: float
    g_u: float
    g_v: float
    b_u: float


def yuv_coefficients(matrix: ColourMatrix, colour_range: ColourRange) -> YuvCoefficients:
    """Coefficients for `matrix` and `colour_range`, derived in float64 and rounded once.

    Limited range folds the luma gain 255/219 into `y_scale` and the chroma gain 255/224 into
    `r_v`, `g_u`, `g_v` and `b_u`.
    """
    kr, kb = LUMA_WEIGHTS[ColourMatrix(matrix)]
    kg = 1.0 - kr - kb
    limited = ColourRange(colour_range) is ColourRange.LIMITED
    if limited:
        y_offset = float(LIMITED_LUMA_OFFSET)
        y_scale = UNIT_SCALE / LIMITED_LUMA_STEPS
        chroma_gain = UNIT_SCALE / LIMITED_CHROMA_STEPS
    else:
        y_offset, y_scale, chroma_gain = 0.0, 1.0, 1.0
    return YuvCoefficients(
        y_offset=float32(y_offset),
        y_scale=float32(y_scale),
        r_v=float32(2.0 * (1.0 - kr) * chroma_gain),
        g_u=float32(2.0 * (1.0 - kb) * kb / kg * chroma_gain),
        g_v=float32(2.0 * (1.0 - kr) * kr / kg * chroma_gain),
        b_u=float32(2.0 * (1.0 - kb) * chroma_gain),
    )


@dataclass(frozen=True)
class SampleScale:
    """How a sample of a 16-bit surface (P016: NVDEC's output for 10- and 12-bit video, each
    value in the high bits) is brought to the 8-bit scale before the YUV -> RGB conversion.

    Per sample, in float32 and in this order (the kernels' VdetSampleScale, the NumPy and torch
    references): ``v = sample >> shift; luma = v * scale;
    chroma = (v - center) * scale + 128``. Limited range divides by 2^(bits - 8) (luma 64..940 at
    10 bits is 16..235; both divisions exact); full range maps 0..2^bits - 1 to 0..255 with
    chroma centred on 2^(bits - 1) (ITU-R BT.2100's full-range quantisation).
    """

    shift: int
    scale: float
    center: float


def sample_scale(bits: int, colour_range: ColourRange) -> SampleScale:
    """The `SampleScale` of `bits`-bit samples (9..16) held in 16 bits."""
    if not 8 < bits <= 16:
        raise ValueError(f"16-bit surfaces hold 9- to 16-bit samples, got {bits} bits")
    if ColourRange(colour_range) is ColourRange.LIMITED:
        scale = 1.0 / float(1 << (bits - 8))
    else:
        scale = float32(UNIT_SCALE / float((1 << bits) - 1))
    return SampleScale(shift=16 - bits, scale=scale, center=float(1 << (bits - 1)))


# ---- post-process ---------------------------------------------------------------------------

# Serving defaults: settings' `detection` group, the CLI, the TensorRT plugin node.
CONF_THRESHOLD = 0.25
IOU_THRESHOLD = 0.45
TOP_K = 1000
MAX_DET = 300
CLASS_AGNOSTIC = False

# Evaluation (`vdet eval`, the accuracy studies): Ultralytics' validation settings, so that mAP
# is comparable with theirs; a wider candidate pool than serving.
EVAL_CONF_THRESHOLD = 0.001
EVAL_IOU_THRESHOLD = 0.7
EVAL_TOP_K = 3000
EVAL_MAX_DET = 300

# Largest top_k the GPU decode + NMS kernels accept: their candidates are sorted in shared memory.
MAX_TOP_K = 4096


@dataclass(frozen=True)
class PostprocessParams:
    """Thresholds and limits of decode + NMS; validated on construction.

    `top_k` bounds the candidates that enter NMS (its cost grows with top_k * kept);
    `classes`, when set, keeps only anchors whose best class id is in it.
    """

    conf_threshold: float = CONF_THRESHOLD
    iou_threshold: float = IOU_THRESHOLD
    top_k: int = TOP_K
    max_det: int = MAX_DET
    class_agnostic: bool = CLASS_AGNOSTIC
    classes: frozenset[int] | None = None

    def __post_init__(self) -> None:
        for name in ("conf_threshold", "iou_threshold"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {value}")
        for name in ("top_k", "max_det"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.classes is not None:
            # Accept any iterable of ids (a list from a config file) but store a frozenset.
            classes = frozenset(_class_ids(self.classes))
            object.__setattr__(self, "classes", classes)


EVAL_PARAMS = PostprocessParams(
    conf_threshold=EVAL_CONF_THRESHOLD,
    iou_threshold=EVAL_IOU_THRESHOLD,
    top_k=EVAL_TOP_K,
    max_det=EVAL_MAX_DET,
)


def _class_ids(classes: Iterable[object]) -> Iterable[int]:
    for class_id in classes:
        if isinstance(class_id, bool) or not isinstance(class_id, int | np.integer):
            raise ValueError(f"classes must be non-negative ints, got {class_id!r}")
        if class_id < 0:
            raise ValueError(f"classes must be non-negative ints, got {class_id}")
        yield int(class_id)
