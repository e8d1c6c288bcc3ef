"""Hand-made image files for the upload abuse tests: lying headers, odd markers, and a
small deterministic fuzz corpus of damaged real images."""

from __future__ import annotations

import io
import struct
import zlib
from collections.abc import Iterator

import cv2
import numpy as np
from PIL import Image


def scene(wh: tuple[int, int] = (160, 120)) -> np.ndarray:
    """A grey BGR image with a red disc in the middle and a blue square top-left."""
    image = np.full((wh[1], wh[0], 3), 90, np.uint8)
    cv2.circle(image, (wh[0] // 2, wh[1] // 2), min(wh) // 6, (0, 0, 255), -1)
    cv2.rectangle(image, (4, 4), (24, 24), (255, 0, 0), -1)
    return image


def jpeg(image: np.ndarray, **params: int) -> bytes:
    flags = [v for key, value in params.items() for v in (getattr(cv2, key), value)]
    ok, buf = cv2.imencode(".jpg", image, flags)
    assert ok
    return buf.tobytes()


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_claiming(width: int, height: int) -> bytes:
    """A well-formed PNG head saying width x height, then one small IDAT: a decompression
    bomb's shape (a few hundred bytes that would decode to width x height pixels)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\0" * 4096)
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IDAT", idat)


def jpeg_claiming(width: int, height: int, *, marker_after_soi: bytes = b"") -> bytes:
    """A real small JPEG whose frame header (SOF0) claims width x height, optionally with
    extra bytes (a parameterless marker such as FF 01) right after SOI."""
    data = bytearray(jpeg(scene()))
    sof = data.find(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", height, width)
    return b"\xff\xd8" + marker_after_soi + bytes(data[2:])


def progressive_jpeg() -> bytes:
    return jpeg(scene(), IMWRITE_JPEG_PROGRESSIVE=1)


def cmyk_jpeg() -> bytes:
    rgb = Image.fromarray(cv2.cvtColor(scene(), cv2.COLOR_BGR2RGB))
    out = io.BytesIO()
    rgb.convert("CMYK").save(out, "JPEG", quality=95)
    return out.getvalue()


def exif_rotated_jpeg(orientation: int = 6) -> bytes:
    """The scene (160 x 120) stored as is, with EXIF saying: rotate to display (6: 90 cw)."""
    rgb = Image.fromarray(cv2.cvtColor(scene(), cv2.COLOR_BGR2RGB))
    exif = Image.Exif()
    exif[0x0112] = orientation
    out = io.BytesIO()
    rgb.save(out, "JPEG", quality=95, exif=exif.tobytes())
    return out.getvalue()


def seeds() -> list[bytes]:
    """One valid file per accepted format, plus the odd but valid ones above."""
    image = scene((96, 64))
    files = [jpeg(image), progressive_jpeg(), cmyk_jpeg(), exif_rotated_jpeg()]
    for ext in (".png", ".bmp", ".webp"):
        ok, buf = cv2.imencode(ext, image)
        assert ok
        files.append(buf.tobytes())
    return files


def fuzz_corpus(count: int, seed: int = 0) -> Iterator[bytes]:
    """`count` damaged copies of the seeds: flipped bytes, overwritten runs, cuts, splices."""
    rng = np.random.default_rng(seed)
    originals = seeds()
    for _ in range(count):
        data = bytearray(originals[int(rng.integers(len(originals)))])
        kind = int(rng.integers(4))
        if kind == 0:  # flip a few bytes, the header included
            for pos in rng.integers(0, len(data), int(rng.integers(1, 8))):
                data[int(pos)] ^= int(rng.integers(1, 256))
        elif kind == 1:  # overwrite a run with noise
            start = int(rng.integers(0, len(data)))
            run = rng.integers(0, 256, int(rng.integers(1, 64)), dtype=np.uint8).tobytes()
            data[start : start + len(run)] = run
        elif kind == 2:  # cut
            del data[int(rng.integers(4, len(data))) :]
        else:  # big numbers where sizes live (the first 64 bytes)
            pos = int(rng.integers(2, min(64, len(data) - 2)))
            data[pos : pos + 2] = b"\xff\xff"
        yield bytes(data)
