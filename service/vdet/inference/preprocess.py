"""Letterbox: BGR uint8 frames -> the network's RGB float32 CHW input, and the way back.

This module owns the CPU reference preprocess that the CUDA kernels are tested against. The
geometry between source pixels and model-input pixels (`compute_letterbox`, `LetterboxTransform`)
and the pad value are vdet.core.contract's, the one source of those numbers; the rules are restated
below because this is what implements them on the CPU. It must match Ultralytics'
`LetterBox(auto=False, scaleup=True, center=True)` followed by its predictor's BGR->RGB and /255
bit for bit; docs/conventions.md restates these rules for kernel authors.

Conventions (source image w x h, network input W x H):

* Coordinates are continuous pixel *edges*: pixel i covers [i, i + 1); an image spans [0, w].
* gain r = min(H / h, W / w), in float64; images are scaled up as well as down.
* Resized size: new_w = max(round(w * r), 1), new_h = max(round(h * r), 1) with Python's round
  (half to even), so each axis has its own exact scale new_w / w and new_h / h.
* Padding: dw = (W - new_w) / 2, dh = (H - new_h) / 2; left = round(dw - 0.1),
  right = round(dw + 0.1), top = round(dh - 0.1), bottom = round(dh + 0.1): an odd leftover
  pixel goes to the right/bottom. Pad value `PAD_VALUE` (114, as uint8, before normalisation).
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

import cv2
import numpy as np

from vdet.core.contract import PAD_VALUE, UNIT_SCALE, compute_letterbox
from vdet.core.contract import LetterboxTransform as LetterboxTransform
from vdet.core.contract import rect_input_hw as rect_input_hw
from vdet.core.types import FloatArray, ImageArray

# uint8 -> float32 in [0, 1] by a true float32 division (uint8 converts to float32 exactly, and
# IEEE division rounds once), written straight into the output: half the time of a table lookup
# per channel (np.take), with the same bits for all 256 values.
_UNIT_SCALE_F32 = np.float32(UNIT_SCALE)


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
    pad = np.float32(PAD_VALUE) / _UNIT_SCALE_F32
    out[:, :top, :] = pad
    out[:, bottom:, :] = pad
    out[:, top:bottom, :left] = pad
    out[:, top:bottom, right:] = pad
    # Channel c of the output is channel 2 - c of the BGR image.
    for c in range(3):
        interior = out[c, top:bottom, left:right]
        np.divide(resized[:, :, 2 - c], _UNIT_SCALE_F32, out=interior, dtype=np.float32)
    return out, transform


def letterbox_batch(
    images_bgr: Sequence[ImageArray], input_hw: tuple[int, int]
) -> tuple[FloatArray, list[LetterboxTransform]]:
    """Letterbox several images into one (n, 3, H, W) float32 batch; n may be 0."""
    H, W = input_hw
    batch = np.empty((len(images_bgr), 3, H, W), np.float32)
    transforms = [letterbox(image, input_hw, out=batch[i])[1] for i, image in enumerate(images_bgr)]
    return batch, transforms
