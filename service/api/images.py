"""Images at the API edge: recognising and decoding uploads, drawing results, encoding JPEG.

Uploads are identified by their magic bytes, not by what the client claims, and only the
formats below reach `cv2.imdecode`; the pixel count is read from the header first so a small
file that decodes to a huge image is refused before it is decoded. CPU-bound: call these from a
worker thread, never on the event loop.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import cv2
import numpy as np

from vdet.types import Detections, ImageArray

SUPPORTED_FORMATS = ("jpeg", "png", "bmp", "webp")
# 64 megapixels: far above any camera, far below what would exhaust memory when decoded.
MAX_IMAGE_PIXELS = 1 << 26


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


def _header_size(data: bytes, fmt: str) -> tuple[int, int] | None:
    """(width, height) from the header where it is cheap to read; None when unknown."""
    try:
        if fmt == "png" and len(data) >= 24:
            w, h = struct.unpack(">II", data[16:24])
            return int(w), int(h)
        if fmt == "bmp":
            w, h = struct.unpack("<ii", data[18:26])
            return abs(int(w)), abs(int(h))
        if fmt == "webp" and len(data) >= 30:
            chunk = data[12:16]
            if chunk == b"VP8X":
                w = 1 + int.from_bytes(data[24:27], "little")
                h = 1 + int.from_bytes(data[27:30], "little")
                return w, h
            if chunk == b"VP8L":
                bits = int.from_bytes(data[21:25], "little")
                return 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF)
            if chunk == b"VP8 ":
                w, h = struct.unpack("<HH", data[26:30])
                return int(w) & 0x3FFF, int(h) & 0x3FFF
        if fmt == "jpeg":
            return _jpeg_size(data)
    except struct.error:
        return None
    return None


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    i = 2
    while i + 9 < len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        length = int.from_bytes(data[i + 2 : i + 4], "big")
        # SOF0..SOF15 except DHT (C4), JPG (C8) and DAC (CC) carry the frame size.
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            h, w = struct.unpack(">HH", data[i + 5 : i + 9])
            return int(w), int(h)
        i += 2 + length
    return None


def decode_image(data: bytes) -> ImageArray:
    """Decode an uploaded image to HxWx3 uint8 BGR; UnsupportedImageError otherwise."""
    fmt = sniff_format(data)
    if fmt is None:
        raise UnsupportedImageError(
            f"not a supported image; send one of: {', '.join(SUPPORTED_FORMATS)}"
        )
    size = _header_size(data, fmt)
    if size is not None and size[0] * size[1] > MAX_IMAGE_PIXELS:
        raise UnsupportedImageError(
            f"image is {size[0]}x{size[1]}; at most {MAX_IMAGE_PIXELS} pixels are accepted"
        )
    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if image is None or image.ndim != 3 or image.shape[2] != 3:
        raise UnsupportedImageError(f"the {fmt} data is corrupt or truncated")
    return np.ascontiguousarray(image, dtype=np.uint8)


def _colour(class_id: int) -> tuple[int, int, int]:
    # A fixed, well-spread hue per class so the same class keeps its colour across frames.
    hue = (class_id * 47) % 180
    hsv = np.array([[[hue, 220, 255]]], np.uint8)
    b, g, r = cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR)[0, 0]
    return int(b), int(g), int(r)


def draw_detections(
    image_bgr: ImageArray, detections: Detections, names: Sequence[str]
) -> ImageArray:
    """A copy of the image with each box and its 'name score' label drawn on it."""
    canvas = image_bgr.copy()
    thickness = max(1, round(min(canvas.shape[:2]) / 360))
    scale = max(0.35, min(canvas.shape[:2]) / 1200)
    for box, score, cid in zip(
        detections.xyxy.tolist(),
        detections.scores.tolist(),
        detections.class_ids.tolist(),
        strict=True,
    ):
        x1, y1, x2, y2 = (round(v) for v in box)
        colour = _colour(cid)
        cv2.rectangle(canvas, (x1, y1), (max(x1, x2 - 1), max(y1, y2 - 1)), colour, thickness)
        label = f"{names[cid] if 0 <= cid < len(names) else cid} {score:.2f}"
        (tw, th), base = cv2.getTextSize(label, cv2.FONT_HERSHEY_SIMPLEX, scale, 1)
        ty = y1 - 2 if y1 - th - base - 2 >= 0 else y1 + th + 2
        cv2.rectangle(canvas, (x1, ty - th - 2), (x1 + tw + 2, ty + base - 1), colour, -1)
        cv2.putText(canvas, label, (x1 + 1, ty - 1), cv2.FONT_HERSHEY_SIMPLEX, scale, (0, 0, 0), 1)
    return canvas


def encode_jpeg(image_bgr: ImageArray, quality: int = 85) -> bytes:
    ok, buf = cv2.imencode(".jpg", image_bgr, [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise RuntimeError("JPEG encoding failed")
    return bytes(buf.tobytes())
