"""Abuse cases for uploaded images: sizes are read by the decoder (Pillow) before decoding.

A file whose header says "huge" is refused before a pixel is decoded, whatever bytes come
first; valid but unusual files (progressive, CMYK, EXIF-rotated) decode correctly; damaged
files are 415, never a server error.
"""

from __future__ import annotations

import asyncio
import io
import time
import tracemalloc

import cv2
import numpy as np
import pytest
from PIL import Image
from support.apptest import TestClient
from support.crafted_images import (
    cmyk_jpeg,
    exif_rotated_jpeg,
    fuzz_corpus,
    jpeg_claiming,
    png_claiming,
    progressive_jpeg,
    scene,
)

from vdet.api.images import (
    MAX_IMAGE_PIXELS,
    DecodeBudget,
    UnsupportedImageError,
    decode_image,
    probe_image,
)

HUGE = [
    ("png 20000x20000", png_claiming(20000, 20000)),
    ("png just over the limit", png_claiming(4097, 4096)),
    ("jpeg 20000x20000", jpeg_claiming(20000, 20000)),
    ("jpeg FF 01 after SOI", jpeg_claiming(20000, 20000, marker_after_soi=b"\xff\x01")),
    ("jpeg fill bytes after SOI", jpeg_claiming(20000, 20000, marker_after_soi=b"\xff\xff")),
    ("jpeg 65535x65535", jpeg_claiming(65535, 65535)),
]


@pytest.mark.parametrize("data", [d for _, d in HUGE], ids=[name for name, _ in HUGE])
def test_a_header_saying_huge_is_refused_before_decoding(data: bytes) -> None:
    # Once untraced first: the decoder's modules load (and may be compiled) on first use,
    # which is not what is measured.
    with pytest.raises(UnsupportedImageError):
        decode_image(data)
    tracemalloc.start()
    try:
        with pytest.raises(UnsupportedImageError):
            decode_image(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20  # a header parse, not a decode


def test_the_limit_is_the_decoders_size_exactly() -> None:
    def png(wh: tuple[int, int]) -> bytes:
        ok, buf = cv2.imencode(".png", scene(wh))
        assert ok
        return buf.tobytes()

    assert decode_image(png((64, 64)), max_pixels=64 * 64).image.shape == (64, 64, 3)
    with pytest.raises(UnsupportedImageError, match="65x64"):
        decode_image(png((65, 64)), max_pixels=64 * 64)
    assert MAX_IMAGE_PIXELS == 4096 * 4096


def _close_to_scene(image: np.ndarray, tolerance: float = 12.0) -> bool:
    expected = scene().astype(np.float32)
    return image.shape == expected.shape and float(np.abs(image - expected).mean()) < tolerance


def test_progressive_jpeg_decodes() -> None:
    assert _close_to_scene(decode_image(progressive_jpeg()).image)


def test_cmyk_jpeg_decodes_to_the_right_colours() -> None:
    image = decode_image(cmyk_jpeg()).image
    assert _close_to_scene(image)
    assert tuple(image[60, 80]) == pytest.approx((0, 0, 255), abs=40)  # the red disc, BGR


def test_exif_orientation_is_applied() -> None:
    image = decode_image(exif_rotated_jpeg(6)).image  # stored 160x120, shown rotated 90 cw
    assert image.shape == (160, 120, 3)
    assert _close_to_scene(np.rot90(image, 1))  # undo the rotation: the stored scene


def test_fuzz_corpus_is_decoded_or_refused_never_crashes() -> None:
    outcomes = {"decoded": 0, "refused": 0}
    started = time.perf_counter()
    for data in fuzz_corpus(300, seed=18):
        try:
            image = decode_image(data).image
        except UnsupportedImageError:
            outcomes["refused"] += 1
        else:
            assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3
            assert image.shape[0] * image.shape[1] <= MAX_IMAGE_PIXELS
            outcomes["decoded"] += 1
    assert outcomes["decoded"] > 0 and outcomes["refused"] > 0, outcomes
    assert time.perf_counter() - started < 60  # a runaway decode, not a speed target


@pytest.mark.parametrize("data", [d for _, d in HUGE[:4]], ids=[n for n, _ in HUGE[:4]])
def test_huge_uploads_are_415_through_the_api(client: TestClient, data: bytes) -> None:
    r = client.post("/v1/detect", content=data, headers={"content-type": "image/jpeg"})
    assert r.status_code == 415
    assert "pixels" in r.json()["detail"] or "not decodable" in r.json()["detail"]


def test_fuzzed_uploads_never_answer_5xx(client: TestClient) -> None:
    for data in fuzz_corpus(40, seed=7):
        r = client.post("/v1/detect", content=data, headers={"content-type": "image/jpeg"})
        assert r.status_code in (200, 415), (r.status_code, r.text)


def _encoded(image: np.ndarray, ext: str) -> bytes:
    ok, buf = cv2.imencode(ext, image)
    assert ok
    return buf.tobytes()


@pytest.mark.parametrize("ext", [".jpg", ".png", ".bmp", ".webp"])
@pytest.mark.parametrize("wh", [(4000, 3000), (2560, 1440), (1000, 4000), (640, 480)])
def test_an_upload_is_decoded_reduced_to_the_model_size_and_no_further(
    ext: str, wh: tuple[int, int]
) -> None:
    """The long side stays at least `fit` (here 640) and under twice it; the picture is the
    same picture (compared with the full decode, reduced by OpenCV's area filter)."""
    original = scene(wh)
    decoded = decode_image(_encoded(original, ext), fit=640)
    height, width = decoded.image.shape[:2]
    assert (decoded.width, decoded.height) == wh
    assert 640 <= max(width, height) < max(1280, max(wh) + 1)
    assert abs(width / height - wh[0] / wh[1]) < 0.02
    expected = cv2.resize(original, (width, height), interpolation=cv2.INTER_AREA)
    assert float(np.abs(decoded.image.astype(np.float32) - expected).mean()) < 6.0
    sx, sy = decoded.scale_xy
    assert abs(sx * width - wh[0]) < 1e-6 and abs(sy * height - wh[1]) < 1e-6


def test_exif_orientation_survives_reduction() -> None:
    rgb = cv2.cvtColor(scene((1600, 1200)), cv2.COLOR_BGR2RGB)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 cw to display
    out = io.BytesIO()
    Image.fromarray(rgb).save(out, "JPEG", quality=95, exif=exif.tobytes())
    decoded = decode_image(out.getvalue(), fit=400)
    assert (decoded.width, decoded.height) == (1200, 1600)
    assert decoded.image.shape[:2] == (400, 300)  # draft 1/4, upright
    upright = cv2.rotate(scene((1600, 1200)), cv2.ROTATE_90_CLOCKWISE)
    expected = cv2.resize(upright, (300, 400), interpolation=cv2.INTER_AREA)
    assert float(np.abs(decoded.image.astype(np.float32) - expected).mean()) < 6.0


def test_what_a_decode_costs_is_known_from_the_header() -> None:
    big = scene((4096, 4096))
    assert probe_image(_encoded(big, ".png"), fit=640).cost_pixels == 4096 * 4096
    assert probe_image(_encoded(big, ".jpg"), fit=640).cost_pixels == 640 * 640
    palette = io.BytesIO()
    Image.new("P", (1000, 1000)).save(palette, "PNG")
    assert probe_image(palette.getvalue(), fit=640).cost_pixels == 2 * 1000 * 1000


def test_the_decode_budget_is_shared_and_waits_are_bounded() -> None:
    async def run() -> None:
        budget = DecodeBudget(100)
        order: list[str] = []

        async def decode(name: str, pixels: int, hold_s: float) -> None:
            async with budget.share(pixels, wait_s=2.0):
                order.append(f"{name}+")
                await asyncio.sleep(hold_s)
                order.append(f"{name}-")

        await asyncio.gather(decode("a", 60, 0.2), decode("b", 60, 0.0), decode("c", 30, 0.0))
        assert order.index("b+") > order.index("a-")  # b waited for a's share
        assert order.index("c+") < order.index("a-")  # c fitted beside a
        assert budget.free == 100
        async with budget.share(1000, wait_s=1.0):  # more than the budget: alone, not never
            assert budget.free == 0
            with pytest.raises(TimeoutError):
                async with budget.share(1, wait_s=0.05):
                    pass
        assert budget.free == 100

    asyncio.run(run())
