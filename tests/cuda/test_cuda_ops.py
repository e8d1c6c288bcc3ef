"""CUDA kernels (vdet.cuda.ops) against the CPU references, on the GPU and on the emulator.

Every test takes `harness`: `[cuda]` runs on the GPU (marked gpu; skipped without one) and
`[emu]` runs the same kernels on the CPU emulator (tests/support/kernels/emu). Only the sample-clip
tests need PyAV (skipped without it). Tolerances are those of
docs/conventions.md and are restated in each test's docstring.
"""

from __future__ import annotations

import tempfile
import zlib
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.kernels.harness import DEMO_MODEL, SAMPLE_CLIP, Harness

from vdet.core.contract import sample_scale
from vdet.core.types import ColourRange
from vdet.cuda import ops as ops_module
from vdet.cuda.ops import (
    MAX_FRAMES,
    YuvMatrix,
    decode_nms_workspace_bytes,
    nv12_to_bgr,
    p016_to_bgr,
    yuv_coefficients,
)
from vdet.inference.postprocess import PostprocessParams, decode_and_nms_image
from vdet.inference.preprocess import letterbox

ONE_LEVEL = 1.0 / 255.0 + 1e-7  # a resized value may differ from OpenCV's by one uint8 level
PAD = np.float32(114) / np.float32(255)


# ---- preprocess helpers ---------------------------------------------------------------------


def check_letterbox(
    got: np.ndarray, want: np.ndarray, source_wh: tuple[int, int], new_wh: tuple[int, int],
    pad_xy: tuple[int, int],
) -> float:  # fmt: skip
    """Padding bit exact; the image area exact when unscaled, else within one level.

    Returns the fraction of image-area values that differ (OpenCV's fixed-point weights round
    differently from float ones for some values)."""
    assert got.shape == want.shape and got.dtype == np.float32
    assert np.isfinite(got).all(), "some output values were never written"
    (new_w, new_h), (left, top) = new_wh, pad_xy
    inside = np.zeros(got.shape[1:], bool)
    inside[top : top + new_h, left : left + new_w] = True
    np.testing.assert_array_equal(got[:, ~inside], want[:, ~inside])
    assert (got[:, ~inside] == PAD).all()
    diff = np.abs(got[:, inside] - want[:, inside])
    if new_wh == source_wh:
        np.testing.assert_array_equal(got[:, inside], want[:, inside])
    assert diff.max(initial=0.0) <= ONE_LEVEL
    return float((diff > 0).mean()) if diff.size else 0.0


def reference_batch(images_bgr: Sequence[np.ndarray], input_hw: tuple[int, int]) -> np.ndarray:
    return np.stack([letterbox(image, input_hw)[0] for image in images_bgr])


def run_bgr(
    harness: Harness, images: Sequence[np.ndarray], input_hw: tuple[int, int],
    dtype: type[np.generic] = np.float32, pitch_pad: int = 0,
) -> tuple[np.ndarray, list[Any]]:  # fmt: skip
    """Letterbox BGR images on the harness; `pitch_pad` extra pixels per row in memory."""
    frames = []
    for image in images:
        h, w = image.shape[:2]
        padded = np.zeros((h, w + pitch_pad, 3), np.uint8)
        padded[:, :w] = image
        frames.append(harness.put(padded)[:, :w])
    out = harness.full((len(images), 3, *input_hw), np.nan, dtype)
    transforms = harness.ops.letterbox_bgr(frames, out, stream=harness.stream)
    return harness.get(out), transforms


def random_nv12(rng: np.random.Generator, w: int, h: int) -> tuple[np.ndarray, np.ndarray]:
    return (
        rng.integers(0, 256, (h, w), np.uint8),
        rng.integers(0, 256, ((h + 1) // 2, (w + 1) // 2, 2), np.uint8),
    )


# ---- preprocess: BGR --------------------------------------------------------------------------

LETTERBOX_CASES = [
    pytest.param((1920, 1080), (640, 640), id="1080p"),
    pytest.param((640, 480), (640, 640), id="no-resize"),
    pytest.param((517, 333), (640, 640), id="upscale-odd"),
    pytest.param((1279, 719), (640, 640), id="odd-downscale"),
    pytest.param((100, 51), (64, 64), id="100x51"),
    pytest.param((4, 5), (2, 8), id="tiny"),
    pytest.param((1, 3000), (640, 640), id="one-pixel-wide"),
    pytest.param((720, 1280), (384, 640), id="portrait"),
    pytest.param((37, 23), (640, 640), id="upscale-17x"),
    pytest.param((1280, 720), (640, 640), id="exact-2x"),
]


@pytest.mark.parametrize(("source_wh", "input_hw"), LETTERBOX_CASES)
def test_letterbox_bgr_matches_reference(
    harness: Harness, source_wh: tuple[int, int], input_hw: tuple[int, int]
) -> None:
    """Random BGR frames vs `letterbox()`: padding and unscaled frames bit exact, resized values
    within 1/255 + 1e-7 absolute (OpenCV's 11-bit fixed-point weights)."""
    rng = np.random.default_rng(sum(source_wh) + sum(input_hw))
    w, h = source_wh
    image = rng.integers(0, 256, (h, w, 3), np.uint8)
    got, transforms = run_bgr(harness, [image], input_hw, pitch_pad=3)
    want, transform = letterbox(image, input_hw)
    assert transforms == [transform]
    check_letterbox(got[0], want, source_wh, transform.resized_wh,
                    (transform.pad_x, transform.pad_y))  # fmt: skip


def test_letterbox_bgr_batch_of_mixed_sizes(harness: Harness) -> None:
    """One launch for frames of different sizes (each with its own geometry and pitch), more
    frames than one launch takes (MAX_FRAMES), same tolerances as the single-frame test."""
    rng = np.random.default_rng(7)
    sizes = [(int(rng.integers(8, 90)), int(rng.integers(8, 90))) for _ in range(MAX_FRAMES + 5)]
    images = [rng.integers(0, 256, (h, w, 3), np.uint8) for w, h in sizes]
    got, transforms = run_bgr(harness, images, (48, 64), pitch_pad=1)
    want = reference_batch(images, (48, 64))
    for i, transform in enumerate(transforms):
        check_letterbox(got[i], want[i], sizes[i], transform.resized_wh,
                        (transform.pad_x, transform.pad_y))  # fmt: skip


@pytest.mark.parametrize(("source_wh", "input_hw"), LETTERBOX_CASES[:4])
def test_letterbox_bgr_fp16(
    harness: Harness, source_wh: tuple[int, int], input_hw: tuple[int, int]
) -> None:
    """FP16 output equals the FP32 output rounded to half (to nearest even), bit for bit."""
    rng = np.random.default_rng(3)
    w, h = source_wh
    image = rng.integers(0, 256, (h, w, 3), np.uint8)
    got16, _ = run_bgr(harness, [image], input_hw, dtype=np.float16)
    got32, _ = run_bgr(harness, [image], input_hw)
    np.testing.assert_array_equal(got16, got32.astype(np.float16))


# ---- preprocess: NV12 -------------------------------------------------------------------------


def run_nv12(
    harness: Harness, planes: Sequence[tuple[np.ndarray, np.ndarray]], input_hw: tuple[int, int],
    matrix: YuvMatrix, full_range: bool, dtype: type[np.generic] = np.float32,
    pitch_pad: int = 0, uv_2d: bool = False, bits: int | None = None,
) -> np.ndarray:  # fmt: skip
    """Letterbox NV12 planes (uint8), or P016 planes (uint16) of `bits`-bit samples, on the
    harness; `pitch_pad` extra samples per row in memory."""
    ys, uvs = [], []
    for y, uv in planes:
        h, w = y.shape
        y_mem = np.zeros((h, w + pitch_pad), y.dtype)
        y_mem[:, :w] = y
        uv_mem = np.zeros((uv.shape[0], uv.shape[1] + pitch_pad, 2), uv.dtype)
        uv_mem[:, : uv.shape[1]] = uv
        ys.append(harness.put(y_mem)[:, :w])
        uv_t = harness.put(uv_mem)[:, : uv.shape[1]]
        uvs.append(uv_t.reshape(uv.shape[0], -1) if uv_2d and pitch_pad == 0 else uv_t)
    out = harness.full((len(planes), 3, *input_hw), np.nan, dtype)
    if bits is None:
        harness.ops.letterbox_nv12(
            ys, uvs, out, matrix=matrix, full_range=full_range, stream=harness.stream
        )
    else:
        harness.ops.letterbox_p016(
            ys, uvs, out, matrix=matrix, full_range=full_range, bits=bits, stream=harness.stream
        )
    return harness.get(out)


@pytest.mark.parametrize(
    ("source_wh", "input_hw"),
    [*LETTERBOX_CASES[:5], pytest.param((333, 517), (640, 640), id="odd-portrait")],
)
@pytest.mark.parametrize(
    ("matrix", "full_range"),
    [("bt601", False), ("bt709", False), ("bt709", True), ("bt601", True)],
)
def test_letterbox_nv12_matches_reference(
    harness: Harness, source_wh: tuple[int, int], input_hw: tuple[int, int], matrix: YuvMatrix,
    full_range: bool,
) -> None:  # fmt: skip
    """Random NV12 planes (own row pitches) vs `nv12_to_bgr` (NumPy, the same float32
    coefficients and operation order, bit for bit) then `letterbox()`: padding and unscaled
    frames bit exact, resized values within 1/255 + 1e-7."""
    rng = np.random.default_rng(source_wh[0] * 7 + source_wh[1])
    w, h = source_wh
    y, uv = random_nv12(rng, w, h)
    got = run_nv12(harness, [(y, uv)], input_hw, matrix, full_range, pitch_pad=5)
    bgr = nv12_to_bgr(y, uv, yuv_coefficients(matrix, full_range))
    want, t = letterbox(bgr, input_hw)
    check_letterbox(got[0], want, source_wh, t.resized_wh, (t.pad_x, t.pad_y))


def test_letterbox_nv12_fp16_and_2d_uv(harness: Harness) -> None:
    """A (h/2, w) UV plane reads like (h/2, w/2, 2); FP16 is FP32 rounded to half exactly."""
    rng = np.random.default_rng(11)
    planes = [random_nv12(rng, 322, 180), random_nv12(rng, 64, 64)]
    got32 = run_nv12(harness, planes, (160, 160), "bt709", False)
    got16 = run_nv12(harness, planes, (160, 160), "bt709", False, dtype=np.float16, uv_2d=True)
    np.testing.assert_array_equal(got16, got32.astype(np.float16))


# ---- preprocess: P016 (10- and 12-bit video) ----------------------------------------------------


def random_p016(
    rng: np.random.Generator, w: int, h: int, bits: int, low_bits: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Random `bits`-bit samples in the high bits of 16 (as NVDEC writes them); `low_bits` puts
    noise in the bits below (which the conversion must ignore)."""
    shift = 16 - bits
    y = rng.integers(0, 1 << bits, (h, w), np.uint16) << shift
    uv = rng.integers(0, 1 << bits, ((h + 1) // 2, (w + 1) // 2, 2), np.uint16) << shift
    if low_bits and shift:
        y |= rng.integers(0, 1 << shift, y.shape, np.uint16)
        uv |= rng.integers(0, 1 << shift, uv.shape, np.uint16)
    return y.astype(np.uint16), uv.astype(np.uint16)


@pytest.mark.parametrize(
    ("source_wh", "input_hw"),
    [*LETTERBOX_CASES[:5], pytest.param((333, 517), (640, 640), id="odd-portrait")],
)
@pytest.mark.parametrize(
    ("matrix", "full_range", "bits"),
    [("bt709", False, 10), ("bt601", True, 10), ("bt709", True, 12), ("bt601", False, 12)],
)
def test_letterbox_p016_matches_reference(
    harness: Harness, source_wh: tuple[int, int], input_hw: tuple[int, int], matrix: YuvMatrix,
    full_range: bool, bits: int,
) -> None:  # fmt: skip
    """Random P016 planes (own row pitches, noise below the sample bits) vs `p016_to_bgr`
    (NumPy, the same float32 scale, coefficients and operation order, bit for bit) then
    `letterbox()`: padding and unscaled frames bit exact, resized values within 1/255 + 1e-7."""
    rng = np.random.default_rng(source_wh[0] * 5 + source_wh[1] + bits)
    w, h = source_wh
    y, uv = random_p016(rng, w, h, bits, low_bits=True)
    got = run_nv12(harness, [(y, uv)], input_hw, matrix, full_range, pitch_pad=3, bits=bits)
    colour_range = ColourRange.FULL if full_range else ColourRange.LIMITED
    bgr = p016_to_bgr(y, uv, yuv_coefficients(matrix, full_range), sample_scale(bits, colour_range))
    want, t = letterbox(bgr, input_hw)
    check_letterbox(got[0], want, source_wh, t.resized_wh, (t.pad_x, t.pad_y))


def test_letterbox_p016_of_8bit_samples_equals_nv12(harness: Harness) -> None:
    """8-bit samples widened to 16 bits (v << 8) and read as 16-bit limited-range P016 give the
    NV12 kernel's output bit for bit (the 8-bit scale is exact), in FP32 and FP16."""
    rng = np.random.default_rng(16)
    planes = [random_nv12(rng, 322, 180), random_nv12(rng, 64, 64)]
    wide = [(y.astype(np.uint16) << 8, uv.astype(np.uint16) << 8) for y, uv in planes]
    for dtype in (np.float32, np.float16):
        nv12 = run_nv12(harness, planes, (160, 160), "bt709", False, dtype=dtype)
        p016 = run_nv12(harness, wide, (160, 160), "bt709", False, dtype=dtype, bits=16)
        np.testing.assert_array_equal(p016, nv12)


def test_letterbox_p016_checks_its_planes(harness: Harness) -> None:
    """uint8 planes given to the P016 kernel, and bits outside 9..16, are refused."""
    rng = np.random.default_rng(1)
    y, uv = random_nv12(rng, 64, 64)
    out = harness.full((1, 3, 64, 64), np.nan, np.float32)
    with pytest.raises(ValueError, match="uint16"):
        harness.ops.letterbox_p016([harness.put(y)], [harness.put(uv)], out)
    y16, uv16 = random_p016(rng, 64, 64, 10)
    with pytest.raises(ValueError, match="9- to 16-bit"):
        harness.ops.letterbox_p016([harness.put(y16)], [harness.put(uv16)], out, bits=8)


# ---- preprocess: real frames ------------------------------------------------------------------


@cache
def sample_frames() -> tuple[list[np.ndarray], list[np.ndarray], int]:
    """Frames 0, 15, ..., 60 of the sample clip as (BGR, NV12 surface) with PyAV on the CPU,
    and the clip's colour space (1 = BT.709).

    PyAV is imported here, not at module level: a GPU test machine may have no PyAV, and every
    other test in this module must still collect and run there.
    """
    av = pytest.importorskip("av")
    bgr, nv12 = [], []
    with av.open(str(SAMPLE_CLIP)) as container:
        stream = container.streams.video[0]
        for i, frame in enumerate(container.decode(stream)):
            if i % 15 == 0:
                bgr.append(frame.to_ndarray(format="bgr24"))
                nv12.append(frame.to_ndarray(format="nv12"))
                colorspace = int(frame.colorspace)
            if len(bgr) == 5:
                break
    return bgr, nv12, colorspace


def surface_planes(
    harness: Harness, surfaces: Sequence[np.ndarray], h: int
) -> tuple[list[Any], list[Any]]:
    """Each (3h/2, w) surface on the harness, as its Y and UV planes sliced from one buffer
    (as a decoder hands them out)."""
    ys, uvs = [], []
    for surface in surfaces:
        tensor = harness.put(surface)
        ys.append(tensor[:h])
        uvs.append(tensor[h:])
    return ys, uvs


def test_letterbox_sample_clip_bgr(harness: Harness) -> None:
    """Five 1080p frames of the sample clip (PyAV BGR) in one launch vs `letterbox()`:
    padding bit exact, image within 1/255 + 1e-7 (an exact 1/3 scale samples pixels, so in
    practice all values are equal)."""
    images, _, _ = sample_frames()
    got, transforms = run_bgr(harness, images, (640, 640))
    want = reference_batch(images, (640, 640))
    for i, t in enumerate(transforms):
        check_letterbox(got[i], want[i], (1920, 1080), t.resized_wh, (t.pad_x, t.pad_y))


def test_letterbox_sample_clip_nv12(harness: Harness) -> None:
    """The same frames as NV12 surfaces (PyAV `to_ndarray(format="nv12")`, Y and UV sliced
    from one buffer as a decoder hands them out), BT.709 limited range as the clip is tagged:
    vs `nv12_to_bgr` + `letterbox()` within 1/255 + 1e-7, and vs PyAV's own BGR conversion
    (which interpolates chroma) within a mean of 2/255 and a max of 12/255."""
    images, surfaces, colorspace = sample_frames()
    assert colorspace == 1  # BT.709
    h = 1080
    ys, uvs = surface_planes(harness, surfaces, h)
    out = harness.full((len(surfaces), 3, 640, 640), np.nan, np.float32)
    transforms = harness.ops.letterbox_nv12(ys, uvs, out, matrix="bt709", stream=harness.stream)
    got = harness.get(out)
    coefficients = yuv_coefficients("bt709", False)
    for i, (surface, t) in enumerate(zip(surfaces, transforms, strict=True)):
        bgr = nv12_to_bgr(surface[:h], surface[h:], coefficients)
        want, _ = letterbox(bgr, (640, 640))
        check_letterbox(got[i], want, (1920, 1080), t.resized_wh, (t.pad_x, t.pad_y))
        pyav, _ = letterbox(images[i], (640, 640))
        diff = np.abs(got[i] - pyav)
        assert diff.mean() < 2 / 255 and diff.max() < 12 / 255


@cache
def sample_frames_10bit() -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Frames 0 and 3 of the sample clip encoded as 10-bit HEVC (libx265, yuv420p10le, BT.709
    limited range), decoded by PyAV on the CPU: as (BGR from swscale with nearest chroma, P016
    surface)."""
    av = pytest.importorskip("av")
    if "libx265" not in av.codecs_available:
        pytest.skip("this FFmpeg has no libx265")
    media_cases = pytest.importorskip("vdet.modelkit.dataset.media_cases")
    folder = Path(tempfile.mkdtemp(prefix="vdet-p016-"))
    clip = media_cases.reencode(
        SAMPLE_CLIP, folder / "main10.mp4", "libx265", "yuv420p10le", frames=4,
        options={"x265-params": "log-level=error:colorprim=bt709:transfer=bt709:colormatrix=bt709"},
    )  # fmt: skip
    bgr, p016 = [], []
    with av.open(str(clip)) as container:
        for i, frame in enumerate(container.decode(container.streams.video[0])):
            if i in (0, 3):
                assert frame.format.name == "yuv420p10le"
                # Nearest chroma: swscale's default for > 8-bit input interpolates it, which
                # the 8-bit path (and NVDEC's) does not.
                sws = frame.reformat(
                    format="bgr24", src_colorspace="ITU709", src_color_range="MPEG",
                    interpolation="POINT",
                )  # fmt: skip
                bgr.append(sws.to_ndarray())
                p016.append(planar10_to_p016(frame.to_ndarray(), frame.width, frame.height))
    return bgr, p016


def planar10_to_p016(planar: np.ndarray, w: int, h: int) -> np.ndarray:
    """A (3h/2, w) yuv420p10le array (Y, then U and V planes) as the (3h/2, w) P016 surface
    NVDEC writes (Y rows, then interleaved U, V rows; values in the high 10 bits)."""
    flat = planar.reshape(-1)
    u = flat[h * w : h * w + (h // 2) * (w // 2)].reshape(h // 2, w // 2)
    v = flat[h * w + (h // 2) * (w // 2) :].reshape(h // 2, w // 2)
    uv = np.stack([u, v], axis=-1).reshape(h // 2, w)
    return (np.concatenate([planar[:h], uv]) << 6).astype(np.uint16)


def test_letterbox_sample_clip_p016(harness: Harness) -> None:
    """Real 10-bit frames (the sample clip as HEVC Main10) as P016 surfaces, BT.709 limited:
    vs `p016_to_bgr` + `letterbox()` within 1/255 + 1e-7, and vs FFmpeg's own 10-bit -> BGR
    conversion (nearest chroma) within a mean of 2/255 and a max of 12/255, as the NV12 path
    is held to."""
    images, surfaces = sample_frames_10bit()
    h = 1080
    ys, uvs = surface_planes(harness, surfaces, h)
    out = harness.full((len(surfaces), 3, 640, 640), np.nan, np.float32)
    transforms = harness.ops.letterbox_p016(
        ys, uvs, out, matrix="bt709", bits=10, stream=harness.stream
    )
    got = harness.get(out)
    coefficients = yuv_coefficients("bt709", False)
    scale = sample_scale(10, ColourRange.LIMITED)
    for i, (surface, t) in enumerate(zip(surfaces, transforms, strict=True)):
        bgr = p016_to_bgr(surface[:h], surface[h:], coefficients, scale)
        want, _ = letterbox(bgr, (640, 640))
        check_letterbox(got[i], want, (1920, 1080), t.resized_wh, (t.pad_x, t.pad_y))
        ffmpeg, _ = letterbox(images[i], (640, 640))
        diff = np.abs(got[i] - ffmpeg)
        assert diff.mean() < 2 / 255 and diff.max() < 12 / 255


# ---- decode + NMS -----------------------------------------------------------------------------


def random_head(
    rng: np.random.Generator, batch: int, nc: int, n: int, *, dense: bool = False,
    score_step: float | None = None, grid_boxes: bool = False, crowd: bool = False,
) -> np.ndarray:  # fmt: skip
    """[B, 4 + nc, N] float32: boxes in a 640 x 640 input, sigmoid-like scores. `crowd` puts
    every box in one 120 px square (long suppression chains)."""
    head = np.empty((batch, 4 + nc, n), np.float32)
    if crowd:
        head[:, 0:2] = rng.uniform(0, 120, (batch, 2, n))
        head[:, 2:4] = rng.uniform(10, 60, (batch, 2, n))
    elif grid_boxes:  # integer boxes on a coarse grid: many exactly equal IoUs
        head[:, 0:2] = rng.integers(2, 40, (batch, 2, n)) * 16
        head[:, 2:4] = rng.integers(1, 8, (batch, 2, n)) * 32
    else:
        head[:, 0:2] = rng.uniform(0, 640, (batch, 2, n))
        head[:, 2:4] = rng.uniform(4, 160, (batch, 2, n))
    if dense:
        scores = rng.uniform(0.3, 0.9, (batch, nc, n))
    else:
        scores = rng.uniform(0, 1, (batch, nc, n)) ** 8
    if score_step is not None:
        scores = np.round(scores / score_step) * score_step
    head[:, 4:] = scores
    return head


def run_decode_nms(
    harness: Harness, raw: np.ndarray, params: PostprocessParams, *, workspace: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    B = raw.shape[0]
    out = harness.full((B, params.max_det, 6), np.nan, np.float32)
    count = harness.full((B,), -1, np.int32)
    anchors = harness.full((B, params.max_det), -7, np.int32)
    ws = None
    if workspace:
        nbytes = decode_nms_workspace_bytes(B, raw.shape[2], params.top_k)
        ws = harness.full((nbytes,), 0xAB, np.uint8)
    harness.ops.decode_nms(
        harness.put(raw), out, count, params, anchors=anchors, workspace=ws, stream=harness.stream
    )
    return harness.get(out), harness.get(count), harness.get(anchors)


def assert_same_detections(
    out: np.ndarray, count: np.ndarray, anchors: np.ndarray, raw: np.ndarray,
    params: PostprocessParams,
) -> list[int]:  # fmt: skip
    """Per image: the same kept anchors in the same order, classes and scores exactly, boxes
    within 1e-4 relative; zeros and -1 after the last. Returns the counts."""
    counts = []
    for b in range(raw.shape[0]):
        ref, ref_anchors = decode_and_nms_image(raw[b].astype(np.float32), params)
        n = int(count[b])
        assert n == len(ref), f"image {b}: {n} detections, reference {len(ref)}"
        np.testing.assert_array_equal(anchors[b, :n], ref_anchors)
        np.testing.assert_array_equal(out[b, :n, 5], ref.class_ids.astype(np.float32))
        np.testing.assert_array_equal(out[b, :n, 4], ref.scores)
        np.testing.assert_allclose(out[b, :n, :4], ref.xyxy, rtol=1e-4, atol=1e-6)
        assert (out[b, n:] == 0).all() and (anchors[b, n:] == -1).all()
        counts.append(n)
    return counts


NMS_CASES = [
    pytest.param(dict(batch=1, nc=3, n=0), {}, id="no-anchors"),
    pytest.param(dict(batch=2, nc=5, n=300), dict(conf_threshold=0.999), id="empty"),
    pytest.param(dict(batch=1, nc=4, n=3000, dense=True), dict(conf_threshold=0.0, top_k=4096),
                 id="all-pass"),
    pytest.param(dict(batch=2, nc=80, n=2000, score_step=1 / 32), dict(conf_threshold=0.01),
                 id="score-ties"),
    pytest.param(dict(batch=1, nc=1, n=2000, dense=True, score_step=0.5),
                 dict(conf_threshold=0.1, top_k=300), id="all-tied-topk"),
    pytest.param(dict(batch=1, nc=2, n=1500, grid_boxes=True, dense=True),
                 dict(iou_threshold=0.5), id="iou-ties"),
    pytest.param(dict(batch=3, nc=80, n=8400), dict(classes=frozenset({0, 2, 79, 500})),
                 id="class-filter"),
    pytest.param(dict(batch=2, nc=80, n=8400), dict(classes=frozenset()), id="empty-filter"),
    pytest.param(dict(batch=2, nc=20, n=4000, dense=True), dict(class_agnostic=True),
                 id="agnostic"),
    pytest.param(dict(batch=2, nc=80, n=8400), dict(max_det=5), id="max-det"),
    pytest.param(dict(batch=1, nc=80, n=8400, dense=True), {}, id="dense-8400x80"),
    pytest.param(dict(batch=2, nc=80, n=8400, dense=True), dict(top_k=100, max_det=1000),
                 id="dense-topk-100"),
    pytest.param(dict(batch=1, nc=80, n=8400, dense=True), dict(top_k=4096),
                 id="dense-topk-4096"),
    pytest.param(dict(batch=2, nc=1, n=3000, dense=True, crowd=True), dict(top_k=2000),
                 id="crowded-one-class"),
    pytest.param(dict(batch=1, nc=7, n=500), dict(iou_threshold=0.0), id="iou-0"),
    pytest.param(dict(batch=1, nc=7, n=500), dict(iou_threshold=1.0, conf_threshold=0.05),
                 id="iou-1"),
]  # fmt: skip


@pytest.mark.parametrize(("head_kwargs", "param_kwargs"), NMS_CASES)
def test_decode_nms_matches_reference(
    harness: Harness, head_kwargs: dict[str, Any], param_kwargs: dict[str, Any]
) -> None:
    """Random heads vs `decode_and_nms_image`, per image: same anchors in the same order,
    classes and scores exact, boxes within 1e-4 relative (the kernel is bit exact by design:
    same float32 operations, no FMA contraction)."""
    rng = np.random.default_rng(len(str(head_kwargs)) * 31 + len(str(param_kwargs)))
    raw = random_head(rng, **head_kwargs)
    params = PostprocessParams(**param_kwargs)
    got = run_decode_nms(harness, raw, params)
    counts = assert_same_detections(*got, raw, params)
    if "empty" in str(param_kwargs) or head_kwargs["n"] == 0:
        assert counts == [0] * raw.shape[0]


@pytest.mark.parametrize("workspace", [False, True], ids=["allocated", "workspace"])
def test_decode_nms_fp16_head(harness: Harness, workspace: bool) -> None:
    """An FP16 head decodes like the same head cast to float32 (exact), with a caller's
    workspace or a stream-ordered allocation."""
    rng = np.random.default_rng(5)
    raw = random_head(rng, 2, 80, 8400).astype(np.float16)
    params = PostprocessParams(conf_threshold=0.05)
    assert_same_detections(*run_decode_nms(harness, raw, params, workspace=workspace), raw, params)


# The mask kernel is compiled with __launch_bounds__(VDET_MASK_THREADS = 256), so a real GPU
# refuses more threads per block (the H200 said CUDA_ERROR_INVALID_VALUE for 1024); the CPU
# emulator has no such limit, hence the bound here.
@pytest.mark.parametrize("mask_threads", [64, 256])
def test_decode_nms_other_launch_shapes(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, mask_threads: int
) -> None:
    """The other launch shapes the kernels document (what the TensorRT plugin's launcher uses):
    mask tiles of 64 * L threads, and a sweep given room for two row tiles only (tile-at-a-time
    with prefetch) instead of the whole mask. Same results, exactly."""
    monkeypatch.setattr(ops_module, "MASK_THREADS", mask_threads)
    monkeypatch.setattr(
        ops_module,
        "scan_shared_bytes",
        lambda words, keep, _: ops_module.SCAN_SMEM_HEADER + 2 * 64 * 8 * words + 4 * keep,
    )
    rng = np.random.default_rng(mask_threads)
    for raw, params in [
        (random_head(rng, 2, 80, 8400, dense=True), PostprocessParams()),
        (random_head(rng, 1, 1, 3000, dense=True, crowd=True), PostprocessParams(top_k=2000)),
    ]:
        assert_same_detections(*run_decode_nms(harness, raw, params), raw, params)


# ---- decode + NMS: the top-k selection's branches -------------------------------------------


def selection_branch(head: np.ndarray, params: PostprocessParams) -> str:
    """Which branch vdet_select_topk takes for one image [4 + nc, N], mirrored in NumPy:
    "all" (at most top_k candidates), else by the 2048-bin score histogram's bucket that holds
    the top_k-th key: "whole" (kept whole), "buffered" (radix-selected from <= 1024 keys put
    aside) or "unbuffered" (radix-selected from all keys). Only there to prove that the cases
    below reach each branch; keep it in step with VDET_SELECT_* in decode_nms.cuh."""
    scores = head[4:].astype(np.float32)
    best = scores.max(axis=0)
    passed = best > np.float32(params.conf_threshold)
    if int(passed.sum()) <= params.top_k:
        return "all"
    conf = np.float32(params.conf_threshold)
    base = int(conf.view(np.uint32)) if conf > 0 else 0
    shift = max(max(0x3F800000 - base - 1, 0).bit_length() - 11, 0)
    digit = np.minimum((best[passed].view(np.uint32).astype(np.int64) - base) >> shift, 2047)
    hist = np.bincount(digit, minlength=2048)
    above = np.cumsum(hist[::-1])[::-1] - hist  # keys in higher buckets
    bucket = np.flatnonzero((above < params.top_k) & (above + hist >= params.top_k))[0]
    need, size = params.top_k - above[bucket], hist[bucket]
    return "whole" if size == need else "buffered" if size <= 1024 else "unbuffered"


def head_with_scores(rng: np.random.Generator, best: np.ndarray, nc: int = 3) -> np.ndarray:
    """[1, 4 + nc, N]: random boxes; anchor i's best score is best[i] (float32, in a random
    class), its other classes strictly lower."""
    n = best.size
    head = np.empty((1, 4 + nc, n), np.float32)
    head[0, 0:2] = rng.uniform(0, 640, (2, n))
    head[0, 2:4] = rng.uniform(4, 160, (2, n))
    scores = (rng.uniform(0, 0.9, (nc, n)) * best).astype(np.float32)
    scores[rng.integers(0, nc, n), np.arange(n)] = best
    head[0, 4:] = scores
    return head


def tied_scores(
    rng: np.random.Generator, n: int, above: int, tied: int, score: float = 0.75
) -> np.ndarray:
    """`above` distinct scores over (score, 0.95], `tied` of exactly `score`, the rest in
    (0.3, score - 0.05), in random anchor order."""
    high = np.linspace(score + 0.01, 0.95, above, dtype=np.float32)
    low = rng.uniform(0.3, score - 0.05, n - above - tied)
    best = np.concatenate([high, np.full(tied, score), low]).astype(np.float32)
    return rng.permutation(best)


def score_bucket(conf: float, score: float) -> tuple[int, int]:
    """(first float32 bits, width in bits) of the first-histogram bucket that holds `score`,
    as vdet_select_topk splits (conf, 1)."""
    base = int(np.float32(conf).view(np.uint32)) if conf > 0 else 0
    shift = max(max(0x3F800000 - base - 1, 0).bit_length() - 11, 0)
    bucket = (int(np.float32(score).view(np.uint32)) - base) >> shift
    return base + (bucket << shift), 1 << shift


def scores_from_bits(rng: np.random.Generator, *parts: tuple[int, int, int]) -> np.ndarray:
    """For each (start, end, count): `count` float32 scores whose bits are in [start, end),
    distinct where the range allows it; all in random anchor order."""
    bits = [rng.choice(np.arange(start, end), count, replace=count > end - start)
            for start, end, count in parts]  # fmt: skip
    return rng.permutation(np.concatenate(bits).astype(np.uint32).view(np.float32))


def straddling_scores(rng: np.random.Generator) -> np.ndarray:
    """conf 0.1: 2000 scores in the bucket of 0.6, 500 in the one above, 2000 below. These
    buckets do not start at a multiple of their width, so the keys of a neighbour share the
    bucket's highest common bits."""
    low, width = score_bucket(0.1, 0.6)
    return scores_from_bits(
        rng, (low + width, low + 2 * width, 500), (low, low + width, 2000),
        (low - width, low, 2000),
    )  # fmt: skip


def tie_inside_bucket(rng: np.random.Generator) -> np.ndarray:
    """conf 0.25: 680 scores above the bucket of 0.8; in it, 300 distinct scores over its top,
    40 equal ones (the top_k-th key among them), 300 over its bottom; 2680 below it. The
    boundary's radix passes go through the score bits, then skip the inverted anchor's
    constant high bits."""
    low, width = score_bucket(0.25, 0.8)
    return scores_from_bits(
        rng, (low + width, low + 20 * width, 680), (low + 5000, low + width, 300),
        (low + 4000, low + 4001, 40), (low, low + 3000, 300), (low - 50 * width, low, 2680),
    )  # fmt: skip


SELECTION_CASES = [
    # The top_k-th key inside a run of equal scores: the lowest anchors of the run are kept.
    pytest.param(lambda rng: tied_scores(rng, 3000, 990, 40), {}, "buffered",
                 id="tie-across-top-k"),
    pytest.param(lambda rng: tied_scores(rng, 3000, 990, 10), {}, "whole", id="tie-ends-at-top-k"),
    pytest.param(lambda rng: tied_scores(rng, 5000, 200, 2000), {}, "unbuffered",
                 id="long-tie-across-top-k"),
    pytest.param(lambda rng: tied_scores(rng, 3000, 0, 3000), {}, "unbuffered", id="all-equal"),
    pytest.param(straddling_scores, dict(conf_threshold=0.1), "unbuffered",
                 id="unaligned-bucket"),
    pytest.param(tie_inside_bucket, {}, "buffered", id="tie-inside-spread-bucket"),
    # conf 0: the boundary in the lowest bucket, among subnormal scores.
    pytest.param(lambda rng: scores_from_bits(rng, (1, 3000, 800), (0x3F000000, 0x3F400000, 500)),
                 dict(conf_threshold=0.0), "buffered", id="subnormal-scores"),
    pytest.param(lambda rng: rng.uniform(1.0, 8.0, 3000).astype(np.float32), {}, "unbuffered",
                 id="scores-above-1"),
    pytest.param(lambda rng: rng.uniform(0.0, 1.0, 6000).astype(np.float32),
                 dict(conf_threshold=0.0), "buffered", id="conf-0"),
    pytest.param(lambda rng: rng.uniform(0.5, 3.0, 3000).astype(np.float32),
                 dict(conf_threshold=1.0), "unbuffered", id="conf-1"),
    pytest.param(lambda rng: tied_scores(rng, 1000, 500, 300), {}, "all", id="exactly-top-k"),
    pytest.param(lambda rng: tied_scores(rng, 1001, 999, 2), {}, "buffered", id="top-k-plus-1"),
    pytest.param(lambda rng: tied_scores(rng, 2000, 0, 2000), dict(top_k=1), "unbuffered",
                 id="top-k-1-all-equal"),
    pytest.param(lambda rng: tied_scores(rng, 2000, 25, 10), dict(top_k=31), "buffered",
                 id="top-k-31"),
    pytest.param(lambda rng: tied_scores(rng, 2000, 20, 40), dict(top_k=33), "buffered",
                 id="top-k-33"),
]  # fmt: skip


@pytest.mark.parametrize("max_shared", [None, 32 * 1024], ids=["staged", "unstaged"])
@pytest.mark.parametrize(("scores", "param_kwargs", "branch"), SELECTION_CASES)
def test_decode_nms_selection_boundaries(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest,
    scores: Callable[[np.random.Generator], np.ndarray], param_kwargs: dict[str, Any],
    branch: str, max_shared: int | None,
) -> None:  # fmt: skip
    """Every branch of the top-k selection, with the top_k boundary inside runs of equal scores
    (the lower anchors of a run are kept), vs `decode_and_nms_image`. Nothing is suppressed
    (no IoU is > 1) and max_det = top_k, so the output is the selected candidates themselves,
    in order. "unstaged": 32 KiB of shared memory, too little to copy the keys there, so every
    pass reads them from global memory."""
    if max_shared is not None:
        monkeypatch.setattr(type(harness.ops.backend), "max_shared_bytes", max_shared)
    rng = np.random.default_rng(zlib.crc32(request.node.callspec.id.encode()))
    raw = np.concatenate([head_with_scores(rng, scores(rng)) for _ in range(2)])
    top_k = param_kwargs.get("top_k", 1000)
    params = PostprocessParams(**{"iou_threshold": 1.0, "max_det": top_k, **param_kwargs})
    assert [selection_branch(image, params) for image in raw] == [branch, branch]
    counts = assert_same_detections(*run_decode_nms(harness, raw, params), raw, params)
    passed = (raw[:, 4:].max(axis=1) > np.float32(params.conf_threshold)).sum(axis=1)
    assert counts == [min(top_k, int(m)) for m in passed]


def test_decode_nms_nan_scores(harness: Harness) -> None:
    """An anchor with a NaN among its scores is dropped, whatever its other scores."""
    rng = np.random.default_rng(9)
    raw = random_head(rng, 1, 6, 256, dense=True)
    raw[0, 4 + 3, ::3] = np.nan
    params = PostprocessParams()
    out, count, anchors = run_decode_nms(harness, raw, params)
    assert_same_detections(out, count, anchors, raw, params)
    assert not (anchors[0, : count[0]] % 3 == 0).any()


# ---- decode + NMS on the demo model -----------------------------------------------------------


@cache
def demo_model_heads() -> np.ndarray:
    """The demo model's raw heads (ONNX Runtime, CPU) for the five sample frames."""
    import onnxruntime as ort

    images, _, _ = sample_frames()
    batch = reference_batch(images, (640, 640))
    session = ort.InferenceSession(str(DEMO_MODEL), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return np.asarray(session.run(None, {name: batch})[0], np.float32)


@pytest.mark.parametrize(
    "param_kwargs",
    [
        pytest.param({}, id="defaults"),
        pytest.param(dict(conf_threshold=0.001), id="conf-0.001"),
        pytest.param(dict(conf_threshold=0.001, class_agnostic=True, top_k=300), id="agnostic"),
        pytest.param(dict(classes=frozenset({0, 3})), id="classes"),
    ],
)
@pytest.mark.parametrize("fp16", [False, True], ids=["fp32", "fp16"])
def test_decode_nms_demo_model(harness: Harness, param_kwargs: dict[str, Any], fp16: bool) -> None:
    """The demo model's heads on five sample frames (one batch) vs `decode_and_nms_image`:
    same anchors, classes and scores exactly, boxes within 1e-4 relative."""
    raw = demo_model_heads()
    if fp16:
        raw = raw.astype(np.float16)
    params = PostprocessParams(**param_kwargs)
    counts = assert_same_detections(*run_decode_nms(harness, raw, params), raw, params)
    assert sum(counts) > 0


# ---- GPU only ---------------------------------------------------------------------------------


@pytest.mark.gpu
def test_decode_nms_in_a_cuda_graph(cuda_harness: Harness) -> None:
    """The four launches and the memset capture into one CUDA graph (with a caller's
    workspace); replays on new inputs give the reference result."""
    torch = cuda_harness.torch
    rng = np.random.default_rng(21)
    params = PostprocessParams()
    raw = cuda_harness.put(random_head(rng, 2, 80, 8400, dense=True))
    out = torch.zeros((2, params.max_det, 6), dtype=torch.float32, device="cuda")
    count = torch.zeros((2,), dtype=torch.int32, device="cuda")
    anchors = torch.zeros((2, params.max_det), dtype=torch.int32, device="cuda")
    ws = torch.empty(decode_nms_workspace_bytes(2, 8400, params.top_k), dtype=torch.uint8,
                     device="cuda")  # fmt: skip
    ops = cuda_harness.ops
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # warm-up: compile and load outside the capture
        ops.decode_nms(raw, out, count, params, anchors=anchors, workspace=ws, stream=stream)
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        capture = torch.cuda.current_stream()
        ops.decode_nms(raw, out, count, params, anchors=anchors, workspace=ws, stream=capture)
    for seed in (1, 2):
        host = random_head(np.random.default_rng(seed), 2, 80, 8400, dense=seed == 1)
        raw.copy_(torch.from_numpy(host))
        graph.replay()
        torch.cuda.synchronize()
        assert_same_detections(
            out.cpu().numpy(), count.cpu().numpy(), anchors.cpu().numpy(), host, params
        )


@pytest.mark.gpu
def test_kernels_report_their_build(cuda_harness: Harness) -> None:
    """After use, both modules are loaded and built for this GPU's architecture."""
    backend: Any = cuda_harness.ops.backend
    for module in ("preprocess", "decode_nms"):
        backend.load(module)
        assert backend.compiled[module].arch == backend.arch
