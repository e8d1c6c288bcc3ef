"""Uploaded images: recognising and decoding them at the API edge, in bounded memory.

Uploads are identified by their magic bytes, not by what the client claims, and decoded by
Pillow restricted to that one format. Pillow reads the header first (`Image.open` is lazy):
`probe_image` checks the size against the pixel limit before any pixel is decoded, so a small
file that would decode to a huge image costs a header parse. Its own decompression-bomb check
(a warning, then an error, far above our limit) is refused the same way.

What a decode costs is what its pixels need, and no more than detection needs:

- a JPEG is decoded reduced (libjpeg's DCT scaling, Pillow's draft mode: 1/2, 1/4 or 1/8)
  to the smallest size whose long side still covers `fit`, the model's input side;
- other formats are decoded whole, then reduced by an integer factor the same way before
  any conversion, so that only the small image is converted to BGR.

Detection then runs on the reduced image and its boxes are scaled back to the upload's own
pixels (`DecodedImage.scale_xy`). `DecodeBudget` shares a budget of decoded pixels among
concurrent uploads (`limits.decode_budget_pixels`): a decode waits for its share, so the
decodes under way never hold more than the budget, however many uploads are admitted. EXIF
orientation is applied, as cameras and phones expect. CPU-bound: call `probe_image` and
`decode_image` from a worker thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import math
import struct
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import cv2
import numpy as np
from PIL import Image, UnidentifiedImageError
from starlette.concurrency import run_in_threadpool

from vdet.core import malloc
from vdet.core.types import ImageArray

SUPPORTED_FORMATS = ("jpeg", "png", "bmp", "webp")
# 16 megapixels (4096 x 4096): above every camera stream. `limits.max_image_pixels` changes it.
MAX_IMAGE_PIXELS = 1 << 24
_PILLOW_FORMATS = {"jpeg": "JPEG", "png": "PNG", "bmp": "BMP", "webp": "WEBP"}
# A decode this large gives its memory back to the system when it is done (DecodeBudget).
_TRIM_PIXELS = 1 << 20
_HIGH_BIT_DEPTH = {"I;16", "I;16B", "I;16L", "I;16N", "I", "F"}
# Modes Image.reduce takes; the others are converted to RGB first, at full size.
_REDUCIBLE = {"L", "LA", "RGB", "RGBA", "CMYK", "YCbCr", "I", "F"}
# EXIF orientation -> the transpose that makes the image upright (ImageOps.exif_transpose's).
_UPRIGHT = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}


class UnsupportedImageError(ValueError):
    """The bytes are not a decodable JPEG, PNG, BMP or WebP image within the size limit."""


@dataclass(frozen=True)
class ImageHeader:
    """What an upload's header says, before any pixel is decoded."""

    fmt: str
    width: int  # as stored (before EXIF orientation)
    height: int
    cost_pixels: int  # pixels its decode holds at once: its share of the decode budget


@dataclass(frozen=True)
class DecodedImage:
    """An upload decoded for detection: `image` (HxWx3 BGR, maybe reduced) and the size of
    the upload itself, upright."""

    image: ImageArray
    width: int
    height: int

    @property
    def scale_xy(self) -> tuple[float, float]:
        """What multiplies `image`'s pixel coordinates into the upload's."""
        return self.width / self.image.shape[1], self.height / self.image.shape[0]


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


def probe_image(
    data: bytes, max_pixels: int = MAX_IMAGE_PIXELS, fit: int | None = None
) -> ImageHeader:
    """The upload's format and size from its header, checked against `max_pixels`, and what
    decoding it for `fit` costs; UnsupportedImageError otherwise."""
    with _opened(data, max_pixels) as (fmt, image):
        width, height = image.size
        cost = width * height
        if fit is not None and fmt == "jpeg":
            cost = math.prod(_jpeg_draft_size(width, height, fit))
        elif image.mode not in _REDUCIBLE:
            cost *= 2  # converted at full size before it is reduced
        return ImageHeader(fmt, width, height, cost)


def decode_image(
    data: bytes, max_pixels: int = MAX_IMAGE_PIXELS, fit: int | None = None
) -> DecodedImage:
    """Decode an upload to BGR, reduced (module docstring) so that its long side is still at
    least `fit` (None: full size); UnsupportedImageError otherwise."""
    with _opened(data, max_pixels) as (fmt, image):
        width, height = image.size
        orientation = _orientation(image)
        if fit is not None and fmt == "jpeg":
            image.draft("RGB", _jpeg_draft_size(width, height, fit))
        image.load()
        factor = max(image.size) // fit if fit is not None else 1
        if factor > 1:
            if image.mode not in _REDUCIBLE:
                image = image.convert("RGB")
            image = image.reduce(factor)
        if orientation in _UPRIGHT:
            image = image.transpose(_UPRIGHT[orientation])
            if orientation >= 5:
                width, height = height, width
        return DecodedImage(_to_bgr(image), width, height)


@contextlib.contextmanager
def _opened(data: bytes, max_pixels: int) -> Iterator[tuple[str, Image.Image]]:
    fmt = sniff_format(data)
    if fmt is None:
        raise UnsupportedImageError(
            f"not a supported image; send one of: {', '.join(SUPPORTED_FORMATS)}"
        )
    try:
        with Image.open(io.BytesIO(data), formats=[_PILLOW_FORMATS[fmt]]) as image:
            width, height = image.size
            if width * height > max_pixels:
                raise UnsupportedImageError(
                    f"image is {width}x{height}; at most {max_pixels} pixels are accepted"
                )
            yield fmt, image
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


def _jpeg_draft_size(width: int, height: int, fit: int) -> tuple[int, int]:
    """The size to ask JPEG draft mode for: the upload's aspect, its long side `fit` (draft
    decodes to the smallest DCT scale at least this large)."""
    scale = min(1.0, fit / max(width, height))
    return max(1, math.ceil(width * scale)), max(1, math.ceil(height * scale))


def _orientation(image: Image.Image) -> int:
    """The EXIF orientation (1: upright); 1 when the EXIF is missing or damaged."""
    try:
        value = image.getexif().get(0x0112, 1)
    except (OSError, ValueError, SyntaxError, struct.error, Warning):
        return 1
    return value if isinstance(value, int) else 1


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


class DecodeBudget:
    """Decoded pixels that concurrent uploads share (`limits.decode_budget_pixels`).

    `share(pixels)` waits until that many are free, at most `wait_s` (TimeoutError), and
    gives them back on exit. Used on the event loop only.
    """

    def __init__(self, pixels: int) -> None:
        self.pixels = pixels
        self.free = pixels
        self._changed = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def share(self, pixels: int, wait_s: float) -> AsyncIterator[None]:
        pixels = min(pixels, self.pixels)  # one decode may always run alone
        async with asyncio.timeout(wait_s), self._changed:
            await self._changed.wait_for(lambda: self.free >= pixels)
            self.free -= pixels
        try:
            yield
        finally:
            async with self._changed:
                self.free += pixels
                self._changed.notify_all()
            if pixels >= _TRIM_PIXELS:
                # Freed in a worker thread's heap, the decode's memory would stay resident
                # (and the next decode, in another thread, adds its own): give it back.
                await run_in_threadpool(malloc.trim)
