"""Letterbox: BGR uint8 frames -> the network's RGB float32 CHW input, and the way back.

This module owns the geometry between source pixels and model-input pixels and the CPU reference
preprocess that later CUDA kernels are tested against. It must match Ultralytics'
`LetterBox(auto=False, scaleup=True, center=True)` followed by its predictor's BGR->RGB and /255
bit for bit; docs/conventions.md restates these rules for kernel authors.

Conventions (source image w x h, network input W x H):

* Coordinates are continuous pixel *edges*: pixel i covers [i, i + 1); an image spans [0, w].
* gain r = min(H / h, W / w), in float64; images are scaled up as well as down.
* Resized size: new_w = max(round(w * r), 1), new_h = max(round(h * r), 1) with Python's round
  (half to even), so each axis has its own exact scale new_w / w and new_h / h.
* Padding: dw = (W - new_w) / 2, dh = (H - new_h) / 2; left = round(dw - 0.1),
  right = round(dw + 0.1), top = round(dh - 0.1), bottom = round(dh + 0.1): an odd leftover
  pixel goes to the right/bottom. Pad value is 114 (as uint8, before normalisation).
* Resize only when the size changes: cv2.resize INTER_LINEAR on uint8, half-pixel centres
  (src = (dst + 0.5) * (w / new_w) - 0.5, clamped at the borders). OpenCV interpolates uint8
  with 11-bit fixed-point weights, so a float kernel may differ by 1 in 255.
* Output channel order RGB, layout CHW, value = uint8 / 255.0 as an IEEE float32 division (not a
  multiplication by 1/255, which differs in the last bit for about half of all values).
* Back to source: x_src = (x_in - left) / (new_w / w), y_src = (y_in - top) / (new_h / h), then
  clipped to [0, w] and [0, h], as Ultralytics' `scale_boxes` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import cv2
import numpy as np

from ..types import FloatArray, ImageArray

PAD_VALUE = 114

# uint8 -> float32 in [0, 1] by true division; a table lookup reproduces it exactly and is faster.
_UNIT_FROM_UINT8: FloatArray = np.arange(256, dtype=np.float32) / np.float32(255)


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
        w, h = self.source_wh
        return max(round(w * self.gain), 1), max(round(h * self.gain), 1)

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


def rect_input_hw(
    source_wh: tuple[int, int], input_hw: tuple[int, int], stride: int
) -> tuple[int, int]:
    """The smallest network input, sides multiples of `stride`, that holds `source_wh`
    letterboxed at the scale it gets in `input_hw`: (384, 640) for 1920x1080 or 1280x720 at
    640x640, (480, 640) for 4:3. The padding a square input spends on a 16:9 frame is 40% of
    the network's work, for no accuracy (the detections are the same boxes)."""
    w, h = source_wh
    H, W = input_hw
    if w < 1 or h < 1:
        raise ValueError(f"source size must be positive, got {source_wh}")
    if stride < 1 or H % stride or W % stride:
        raise ValueError(f"input size {input_hw} must be a multiple of the stride {stride}")
    gain = min(H / h, W / w)
    new_w, new_h = max(round(w * gain), 1), max(round(h * gain), 1)
    return min(-(-new_h // stride) * stride, H), min(-(-new_w // stride) * stride, W)


def compute_letterbox(source_wh: tuple[int, int], input_hw: tuple[int, int]) -> LetterboxTransform:
    """The letterbox geometry for a source size; GPU preprocess calls this on the host too."""
    w, h = source_wh
    H, W = input_hw
    if w < 1 or h < 1:
        raise ValueError(f"source size must be positive, got {source_wh}")
    if H < 1 or W < 1:
        raise ValueError(f"input size must be positive, got {input_hw}")
    gain = min(H / h, W / w)
    new_w, new_h = max(round(w * gain), 1), max(round(h * gain), 1)
    # Ultralytics' asymmetric rounding: the odd leftover pixel goes right/bottom.
    pad_x = round((W - new_w) / 2 - 0.1)
    pad_y = round((H - new_h) / 2 - 0.1)
    return LetterboxTransform(
        gain=gain,
        pad_x=pad_x,
        pad_y=pad_y,
        input_hw=(int(H), int(W)),
        source_wh=(int(w), int(h)),
    )


def letterbox(
    image_bgr: ImageArray, input_hw: tuple[int, int], out: FloatArray | None = None
) -> tuple[FloatArray, LetterboxTransform]:
    """Letterbox one HxWx3 BGR uint8 image into a (3, H, W) RGB float32 array in [0, 1].

    `out`, when given, must be a (3, H, W) float32 array (for example one slot of a batch); it is
    filled in place and returned, which saves a copy per frame.
    """
    if image_bgr.dtype != np.uint8 or image_bgr.ndim != 3 or image_bgr.shape[2] != 3:
        raise ValueError(f"image_bgr must be HxWx3 uint8, got {image_bgr.shape} {image_bgr.dtype}")
    h, w = int(image_bgr.shape[0]), int(image_bgr.shape[1])
    transform = compute_letterbox((w, h), input_hw)
    H, W = transform.input_hw
    if out is None:
        out = np.empty((3, H, W), np.float32)
    elif out.shape != (3, H, W) or out.dtype != np.float32:
        raise ValueError(f"out must be (3, {H}, {W}) float32, got {out.shape} {out.dtype}")

    new_w, new_h = transform.resized_wh
    resized: ImageArray = image_bgr
    if (new_w, new_h) != (w, h):
        # OpenCV rejects some views (negative strides, e.g. a flipped frame); copy those only.
        source = np.ascontiguousarray(image_bgr)
        resized = np.asarray(
            cv2.resize(source, (new_w, new_h), interpolation=cv2.INTER_LINEAR), np.uint8
        )

    left, top = transform.pad_x, transform.pad_y
    right, bottom = left + new_w, top + new_h
    pad = _UNIT_FROM_UINT8[PAD_VALUE]
    out[:, :top, :] = pad
    out[:, bottom:, :] = pad
    out[:, top:bottom, :left] = pad
    out[:, top:bottom, right:] = pad
    # Channel c of the output is channel 2 - c of the BGR image.
    # mode="clip" only skips numpy's index buffering; uint8 indices are always in the table.
    for c in range(3):
        interior = out[c, top:bottom, left:right]
        np.take(_UNIT_FROM_UINT8, resized[:, :, 2 - c], out=interior, mode="clip")
    return out, transform


def letterbox_batch(
    images_bgr: Sequence[ImageArray], input_hw: tuple[int, int]
) -> tuple[FloatArray, list[LetterboxTransform]]:
    """Letterbox several images into one (n, 3, H, W) float32 batch; n may be 0."""
    H, W = input_hw
    batch = np.empty((len(images_bgr), 3, H, W), np.float32)
    transforms = [letterbox(image, input_hw, out=batch[i])[1] for i, image in enumerate(images_bgr)]
    return batch, transforms
