"""Uploaded images: recognising and decoding them at the API edge.

Uploads are identified by their magic bytes, not by what the client claims, and decoded by
Pillow restricted to that one format. Pillow reads the header first (`Image.open` is lazy):
the size it will decode to is checked against the pixel limit before any pixel is decoded,
so a small file that would decode to a huge image costs a header parse. Its own
decompression-bomb check (a warning, then an error, far above our limit) is refused the same
way. EXIF orientation is applied, as cameras and phones expect. CPU-bound: call these from a
worker thread, never on the event loop.
"""

from __future__ import annotations

import io
import struct

import cv2
import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from vdet.core.types import ImageArray

SUPPORTED_FORMATS = ("jpeg", "png", "bmp", "webp")
# 16 megapixels (4096 x 4096): above every camera stream; a decode of that size takes about
# 50 MB (Pillow's image, then the BGR copy). `limits.max_image_pixels` changes it.
MAX_IMAGE_PIXELS = 1 << 24
_PILLOW_FORMATS = {"jpeg": "JPEG", "png": "PNG", "bmp": "BMP", "webp": "WEBP"}
_HIGH_BIT_DEPTH = {"I;16", "I;16B", "I;16L", "I;16N", "I", "F"}


class UnsupportedImageError(ValueError):
    """The bytes are not a decodable JPEG, PNG, BMP or WebP image within the size limit."""


def sniff_format(data: bytes) -> str | None:
    """The image format named by `data`'s magic bytes, if it is one of SUPPORTED_FORMATS."""
    if data.startswith(b"\xff\xd8\xff"):
        return "jpeg"
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "png"
    if data.startswith(b"BM") and len(data) >= 26:
        return "bmp"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return None


def decode_image(data: bytes, max_pixels: int = MAX_IMAGE_PIXELS) -> ImageArray:
    """Decode an uploaded image to HxWx3 uint8 BGR; UnsupportedImageError otherwise."""
    fmt = sniff_format(data)
    if fmt is None:
        raise UnsupportedImageError(
            f"not a supported image; send one of: {', '.join(SUPPORTED_FORMATS)}"
        )
    try:
        with Image.open(io.BytesIO(data), formats=[_PILLOW_FORMATS[fmt]]) as image:
            width, height = image.size
            if width * height > max_pixels:
                raise _too_many_pixels(width, height, max_pixels)
            image.load()
            return _to_bgr(_upright(image))
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise UnsupportedImageError(
            f"image has too many pixels; at most {max_pixels} are accepted"
        ) from exc
    except UnidentifiedImageError as exc:
        raise UnsupportedImageError(f"the {fmt} data is corrupt or not decodable") from exc
    except UnsupportedImageError:
        raise
    except (OSError, ValueError, SyntaxError, EOFError, struct.error, Warning) as exc:
        # Pillow's plugins report damaged data with any of these (a warning where the
        # process turns warnings into errors).
        raise UnsupportedImageError(f"the {fmt} data is corrupt or truncated") from exc


def _upright(image: Image.Image) -> Image.Image:
    """`image` turned as its EXIF orientation says; as stored when its EXIF is damaged."""
    try:
        return ImageOps.exif_transpose(image)
    except (OSError, ValueError, SyntaxError, struct.error, Warning):
        return image


def _too_many_pixels(width: int, height: int, max_pixels: int) -> UnsupportedImageError:
    return UnsupportedImageError(
        f"image is {width}x{height}; at most {max_pixels} pixels are accepted"
    )


def _to_bgr(image: Image.Image) -> ImageArray:
    """HxWx3 uint8 BGR of any Pillow mode (CMYK, palette, grey, alpha dropped, 16-bit)."""
    if image.mode in _HIGH_BIT_DEPTH:
        grey = np.asarray(image)
        scale = 256.0 if image.mode.startswith("I;16") else max(1.0, float(grey.max()) / 255.0)
        grey8 = np.clip(grey / scale, 0, 255).astype(np.uint8)
        return np.ascontiguousarray(cv2.cvtColor(grey8, cv2.COLOR_GRAY2BGR))
    if image.mode != "RGB":
        image = image.convert("RGB")
    # Pillow writes the BGR bytes itself: one copy of the pixels beside its own (read-only).
    bgr = np.frombuffer(image.tobytes("raw", "BGR"), np.uint8)
    return bgr.reshape(image.height, image.width, 3)
