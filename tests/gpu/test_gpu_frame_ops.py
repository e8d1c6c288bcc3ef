"""The pure-torch GPU ops on the CPU: NV12 letterbox against `letterbox`, decode + NMS against
`decode_and_nms_image` (docs/conventions.md tolerances), run on CPU torch.

Tolerances: preprocess padding and unscaled frames exact, resized areas within 1/255 + 1e-6
(float bilinear weights against OpenCV's fixed point); float16 output adds its rounding
(2^-11 relative). Decode + NMS: same count, scores and classes exactly, boxes within 1e-4.
P016 (16-bit 4:2:0 surfaces) at 10 bits: within one level of a float64 formula, within 3 of
FFmpeg's conversion with nearest chroma.
"""

from __future__ import annotations

from dataclasses import replace

import av
import numpy as np
import pytest
import torch

from vdet.core.assets import sample_clip
from vdet.core.contract import sample_scale, yuv_coefficients
from vdet.core.types import ColourMatrix, ColourRange
from vdet.cuda.ops import p016_to_bgr
from vdet.gpu.frame_ops import (
    Nv12Geometry,
    ReferenceDecodeNms,
    nv12_letterbox_reference,
    nv12_to_rgb_u8,
    p016_to_rgb_u8,
    surface_to_rgb_u8,
)
from vdet.inference.postprocess import PostprocessParams, decode_and_nms_image
from vdet.inference.preprocess import letterbox

PAD = np.float32(114) / np.float32(255)
RESIZE_TOLERANCE = 1 / 255 + 1e-6


@pytest.mark.parametrize(
    ("y", "u", "v", "colour_range", "rgb"),
    [
        (235, 128, 128, ColourRange.LIMITED, (255, 255, 255)),
        (16, 128, 128, ColourRange.LIMITED, (0, 0, 0)),
        (255, 128, 128, ColourRange.FULL, (255, 255, 255)),
        (0, 128, 128, ColourRange.FULL, (0, 0, 0)),
        (126, 128, 128, ColourRange.LIMITED, (128, 128, 128)),  # (126 - 16) * 255/219 = 128.08
        (81, 90, 240, ColourRange.LIMITED, (255, 0, 0)),  # BT.601 limited red
    ],
)
def test_nv12_to_rgb_known_colours(
    y: int, u: int, v: int, colour_range: ColourRange, rgb: tuple[int, int, int]
) -> None:
    nv12 = torch.empty((6, 4), dtype=torch.uint8)
    nv12[:4] = y
    nv12[4:, 0::2], nv12[4:, 1::2] = u, v
    geometry = Nv12Geometry.of((4, 4), (8, 8), ColourMatrix.BT601, colour_range)
    out = nv12_to_rgb_u8(nv12, geometry)
    assert out.shape == (3, 4, 4)
    assert out[:, 0, 0].tolist() == pytest.approx(rgb, abs=1)


def test_nv12_to_rgb_uses_each_blocks_chroma() -> None:
    """Nearest chroma: the 2 x 2 luma block at (row 2, col 4) takes UV pair (1, 2)."""
    nv12 = torch.full((6, 8), 128, dtype=torch.uint8)
    nv12[:4] = 120
    nv12[4 + 1, 2 * 2 + 1] = 200  # V of block (1, 2)
    geometry = Nv12Geometry.of((8, 4), (8, 8), ColourMatrix.BT709, ColourRange.LIMITED)
    red = nv12_to_rgb_u8(nv12, geometry)[0]
    hot = red > red[0, 0]
    assert hot.nonzero().tolist() == [[2, 4], [2, 5], [3, 4], [3, 5]]


def _random_nv12(w: int, h: int, seed: int) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    # Smooth-ish content (a gradient plus noise) and some saturated extremes.
    base = np.linspace(0, 255, w * h * 3 // 2).reshape(h * 3 // 2, w)
    noise = rng.integers(-60, 61, (h * 3 // 2, w))
    return torch.from_numpy(np.clip(base + noise, 0, 255).astype(np.uint8))


def _independent_bgr(nv12: np.ndarray, matrix: ColourMatrix, rng: ColourRange) -> np.ndarray:
    """The conversion in float64 NumPy, from Kr/Kb: checks gpu_ops' float32 constants."""
    kr, kb = {ColourMatrix.BT601: (0.299, 0.114), ColourMatrix.BT709: (0.2126, 0.0722)}[matrix]
    h = nv12.shape[0] * 2 // 3
    y = nv12[:h].astype(np.float64)
    uv = nv12[h:].reshape(h // 2, -1, 2).astype(np.float64)
    u = uv[..., 0].repeat(2, 0).repeat(2, 1) - 128
    v = uv[..., 1].repeat(2, 0).repeat(2, 1) - 128
    if rng is ColourRange.LIMITED:
        y, u, v = (y - 16) * 255 / 219, u * 255 / 224, v * 255 / 224
    kg = 1 - kr - kb
    r = y + 2 * (1 - kr) * v
    b = y + 2 * (1 - kb) * u
    g = (y - kr * r - kb * b) / kg
    return np.clip(np.rint(np.stack((b, g, r), axis=-1)), 0, 255).astype(np.uint8)


@pytest.mark.parametrize("matrix", list(ColourMatrix))
@pytest.mark.parametrize("colour_range", list(ColourRange))
def test_nv12_conversion_matches_float64_formula(
    matrix: ColourMatrix, colour_range: ColourRange
) -> None:
    nv12 = _random_nv12(64, 48, 3)
    geometry = Nv12Geometry.of((64, 48), (64, 64), matrix, colour_range)
    rgb = nv12_to_rgb_u8(nv12, geometry).numpy()
    bgr = _independent_bgr(nv12.numpy(), matrix, colour_range)
    # float32 against float64 may round a value on the other side of .5: at most one level.
    diff = np.abs(rgb.transpose(1, 2, 0)[:, :, ::-1].astype(int) - bgr.astype(int))
    assert diff.max() <= 1
    assert (diff > 0).mean() < 0.01


@pytest.mark.parametrize(
    ("size_wh", "input_hw"),
    [
        ((1920, 1080), (640, 640)),  # exact 3x down
        ((640, 480), (640, 640)),  # no resize: exact
        ((518, 334), (640, 640)),  # up
        ((100, 52), (64, 64)),
        ((1280, 720), (384, 640)),
        ((2, 2), (8, 8)),
    ],
)
@pytest.mark.parametrize(
    ("matrix", "colour_range"),
    [(ColourMatrix.BT709, ColourRange.LIMITED), (ColourMatrix.BT601, ColourRange.FULL)],
)
def test_reference_preprocess_matches_cpu_letterbox(
    size_wh: tuple[int, int],
    input_hw: tuple[int, int],
    matrix: ColourMatrix,
    colour_range: ColourRange,
) -> None:
    w, h = size_wh
    nv12 = _random_nv12(w, h, w + h)
    geometry = Nv12Geometry.of(size_wh, input_hw, matrix, colour_range)
    rgb = nv12_to_rgb_u8(nv12, geometry).numpy().astype(np.uint8)
    bgr = np.ascontiguousarray(rgb.transpose(1, 2, 0)[:, :, ::-1])
    expected, transform = letterbox(bgr, input_hw)

    out = torch.full((3, *input_hw), -1.0)
    nv12_letterbox_reference(nv12, geometry, out)
    got = out.numpy()

    new_w, new_h = transform.resized_wh
    left, top = transform.pad_x, transform.pad_y
    inside = np.zeros(input_hw, bool)
    inside[top : top + new_h, left : left + new_w] = True
    assert (got[:, ~inside] == PAD).all()  # padding bit exact
    diff = np.abs(got - expected)[:, inside]
    if (new_w, new_h) == size_wh:
        assert diff.max() == 0
    else:
        assert diff.max() <= RESIZE_TOLERANCE


def test_reference_preprocess_fp16_output() -> None:
    nv12 = _random_nv12(320, 240, 1)
    geometry = Nv12Geometry.of((320, 240), (320, 320))
    out32 = torch.empty((3, 320, 320))
    out16 = torch.empty((3, 320, 320), dtype=torch.float16)
    nv12_letterbox_reference(nv12, geometry, out32)
    nv12_letterbox_reference(nv12, geometry, out16)
    assert torch.allclose(out16.float(), out32, atol=0, rtol=2**-11)


def test_reference_preprocess_rejects_bad_shapes() -> None:
    geometry = Nv12Geometry.of((64, 48), (64, 64))
    with pytest.raises(ValueError, match="nv12 must be"):
        nv12_letterbox_reference(
            torch.zeros((48, 64), dtype=torch.uint8), geometry, torch.empty(3, 64, 64)
        )
    with pytest.raises(ValueError, match="out must have shape"):
        nv12_letterbox_reference(
            torch.zeros((72, 64), dtype=torch.uint8), geometry, torch.empty(3, 32, 64)
        )
    with pytest.raises(ValueError, match="even sizes"):
        Nv12Geometry.of((63, 48), (64, 64))


# ----------------------------------------------------------------------------- decode + NMS


def _clustered_head(seed: int, n: int = 1200, nc: int = 4, clusters: int = 10) -> np.ndarray:
    """Boxes around a few centres (so NMS has work), random scores without ties."""
    rng = np.random.default_rng(seed)
    head = np.zeros((4 + nc, n), np.float32)
    centres = rng.uniform(40, 600, (clusters, 2))
    which = rng.integers(0, clusters, n)
    head[0:2] = (centres[which] + rng.normal(0, 6, (n, 2))).T
    head[2:4] = rng.uniform(15, 90, (2, n))
    head[4:] = rng.permutation(n * nc).reshape(nc, n).astype(np.float32) / (n * nc)
    head[4:] = head[4:] ** 4  # most anchors below the threshold
    return head


def _run(
    heads: list[np.ndarray], params: PostprocessParams, iterations: int = 8
) -> tuple[np.ndarray, np.ndarray]:
    raw = torch.from_numpy(np.stack(heads))
    boxes = torch.full((len(heads), params.max_det, 6), 7.0)
    count = torch.full((len(heads),), 99, dtype=torch.int32)
    ReferenceDecodeNms(iterations)(raw, params, boxes, count)
    return boxes.numpy(), count.numpy()


def _assert_same(
    boxes: np.ndarray, count: int, head: np.ndarray, params: PostprocessParams
) -> None:
    dets = decode_and_nms_image(head, params)[0]
    assert count == len(dets)
    np.testing.assert_array_equal(boxes[:count, 4], dets.scores)
    np.testing.assert_array_equal(boxes[:count, 5].astype(np.int32), dets.class_ids)
    np.testing.assert_allclose(boxes[:count, :4], dets.xyxy, atol=1e-4, rtol=0)
    assert (boxes[count:] == 0).all()


@pytest.mark.parametrize(
    "params",
    [
        PostprocessParams(),
        PostprocessParams(conf_threshold=0.05, iou_threshold=0.3),
        PostprocessParams(conf_threshold=0.05, iou_threshold=0.6, class_agnostic=True),
        PostprocessParams(conf_threshold=0.05, top_k=50, max_det=20),
        PostprocessParams(conf_threshold=0.02, max_det=5),
        PostprocessParams(conf_threshold=0.05, classes=frozenset({1, 3, 17})),
        PostprocessParams(conf_threshold=0.999),  # nothing passes: the empty (0, 6) case
    ],
)
def test_reference_decode_nms_matches_cpu(params: PostprocessParams) -> None:
    heads = [_clustered_head(seed) for seed in range(4)]
    boxes, count = _run(heads, params)
    for b, head in enumerate(heads):
        _assert_same(boxes[b], int(count[b]), head, params)


def test_reference_decode_nms_ties_nan_and_strict_thresholds(make_head) -> None:  # type: ignore[no-untyped-def]
    head = make_head(
        [[10, 10, 10, 10], [100, 100, 10, 10], [50, 50, 10, 10], [200, 200, 10, 10], [9, 9, 4, 4]],
        [[0.5, 0.5], [0.5, 0.2], [0.25, 0.1], [np.nan, 0.9], [0.5, 0.5]],
    )
    params = PostprocessParams(conf_threshold=0.25, iou_threshold=0.0)
    boxes, count = _run([head], params)
    _assert_same(boxes[0], int(count[0]), head, params)
    # Equal scores keep anchor order; the score equal to the threshold and the NaN row drop;
    # the last box, inside the first (IoU > 0), goes.
    assert boxes[0, : count[0], 4].tolist() == [0.5, 0.5]
    assert boxes[0, : count[0], :2].tolist() == [[5, 5], [95, 95]]


def test_reference_decode_nms_flags_long_chains() -> None:
    """A chain where each box would suppress the next needs one sweep per link."""
    n = 12
    xs = np.arange(n, dtype=np.float32) * 6.0 + 100  # width 10, step 6: IoU(i, i+1) = 0.25
    head = np.zeros((5, n), np.float32)
    head[0], head[1], head[2], head[3] = xs, 100, 10, 10
    head[4] = np.linspace(0.9, 0.5, n, dtype=np.float32)
    params = PostprocessParams(iou_threshold=0.2)
    boxes, count = _run([head], params, iterations=3)
    assert count[0] == -1  # not proven within 3 sweeps: the caller must use the host
    boxes, count = _run([head], params, iterations=n)
    _assert_same(boxes[0], int(count[0]), head, params)
    assert count[0] == n // 2  # every other box survives


def test_reference_decode_nms_agrees_with_torchvision() -> None:
    torchvision = pytest.importorskip("torchvision")
    head = _clustered_head(11)
    params = PostprocessParams(conf_threshold=0.05, iou_threshold=0.5, top_k=100000, max_det=1000)
    _, count = _run([head], params)
    # torchvision's NMS over all candidates above the threshold keeps the same number.
    nms_free = PostprocessParams(
        conf_threshold=0.05, iou_threshold=1.0, top_k=100000, max_det=100000
    )
    dets = decode_and_nms_image(head, nms_free)[0]
    keep = torchvision.ops.batched_nms(
        torch.from_numpy(dets.xyxy),
        torch.from_numpy(dets.scores),
        torch.from_numpy(dets.class_ids),
        0.5,
    )
    assert count[0] == len(keep)


def test_reference_decode_nms_checks_shapes() -> None:
    nms = ReferenceDecodeNms()
    raw = torch.zeros((1, 6, 10))
    with pytest.raises(ValueError, match="out_boxes"):
        nms(
            raw,
            PostprocessParams(max_det=5),
            torch.zeros(1, 4, 6),
            torch.zeros(1, dtype=torch.int32),
        )
    with pytest.raises(ValueError, match="out_count"):
        nms(
            raw,
            PostprocessParams(max_det=5),
            torch.zeros(1, 5, 6),
            torch.zeros(2, dtype=torch.int32),
        )
    with pytest.raises(ValueError, match="iterations"):
        ReferenceDecodeNms(0)


# ---- 16-bit surfaces (P016: NVDEC's output for 10- and 12-bit video) -------------------------


def _p016(y: np.ndarray, u: np.ndarray, v: np.ndarray, bits: int = 10) -> torch.Tensor:
    """A P016 surface from planar `bits`-bit Y (h, w), U and V (h/2, w/2)."""
    h, w = y.shape
    uv = np.stack((u, v), axis=-1).reshape(h // 2, w)
    samples = np.concatenate((y, uv)).astype(np.uint32) << (16 - bits)
    return torch.from_numpy(samples.astype(np.uint16))


def _p016_of(frame: av.VideoFrame) -> torch.Tensor:
    yuv = frame.to_ndarray()  # (h * 3 / 2, w): Y, then the U plane, then the V plane
    h, w = frame.height, frame.width
    u = yuv[h : h + h // 4].reshape(h // 2, w // 2)
    v = yuv[h + h // 4 :].reshape(h // 2, w // 2)
    return _p016(yuv[:h], u, v)


@pytest.mark.parametrize(
    ("y", "c", "colour_range", "grey"),
    [
        (940, 512, ColourRange.LIMITED, 255),
        (64, 512, ColourRange.LIMITED, 0),
        (1023, 512, ColourRange.FULL, 255),
        (0, 512, ColourRange.FULL, 0),
        (504, 512, ColourRange.LIMITED, 128),  # (504 / 4 - 16) * 255/219 = 128.08
    ],
)
def test_p016_known_levels(y: int, c: int, colour_range: ColourRange, grey: int) -> None:
    p016 = _p016(np.full((4, 4), y), np.full((2, 2), c), np.full((2, 2), c))
    geometry = Nv12Geometry.of((4, 4), (8, 8), ColourMatrix.BT709, colour_range, bits=10)
    assert p016_to_rgb_u8(p016, geometry)[:, 0, 0].tolist() == [grey] * 3


def _independent_bgr10(yuv: np.ndarray, matrix: ColourMatrix, rng: ColourRange) -> np.ndarray:
    """10-bit planar Y, U, V -> BGR in float64 from Kr/Kb and BT.2100's quantisation."""
    kr, kb = {ColourMatrix.BT601: (0.299, 0.114), ColourMatrix.BT709: (0.2126, 0.0722)}[matrix]
    h, w = yuv.shape[0] * 2 // 3, yuv.shape[1]
    y = yuv[:h].astype(np.float64)
    u = yuv[h : h + h // 4].reshape(h // 2, w // 2).repeat(2, 0).repeat(2, 1) - 512.0
    v = yuv[h + h // 4 :].reshape(h // 2, w // 2).repeat(2, 0).repeat(2, 1) - 512.0
    if rng is ColourRange.LIMITED:
        y, u, v = (y - 64) * 255 / 876, u * 255 / 896, v * 255 / 896
    else:
        y, u, v = y * 255 / 1023, u * 255 / 1023, v * 255 / 1023
    kg = 1 - kr - kb
    r = y + 2 * (1 - kr) * v
    b = y + 2 * (1 - kb) * u
    g = (y - kr * r - kb * b) / kg
    return np.clip(np.rint(np.stack((b, g, r), axis=-1)), 0, 255).astype(np.uint8)


_SWS = {ColourMatrix.BT709: "ITU709", ColourMatrix.BT601: "ITU601"}
_SWS_RANGE = {ColourRange.LIMITED: "MPEG", ColourRange.FULL: "JPEG"}


@pytest.fixture(scope="module")
def picture() -> av.VideoFrame:
    with av.open(str(sample_clip())) as container:
        frame = next(container.decode(video=0))
    return frame.reformat(width=640, height=360)


@pytest.mark.parametrize("matrix", list(ColourMatrix))
@pytest.mark.parametrize("colour_range", list(ColourRange))
def test_p016_conversion_matches_float64_and_ffmpeg(
    picture: av.VideoFrame, matrix: ColourMatrix, colour_range: ColourRange
) -> None:
    """The sample's first frame at 10 bits: within one level of the float64 formula
    everywhere; within 3 of FFmpeg's own conversion with nearest chroma (swscale's default
    for >8-bit input interpolates chroma, which the 8-bit path does not)."""
    cs, cr = _SWS[matrix], _SWS_RANGE[colour_range]
    ten = picture.reformat(format="yuv420p10le", dst_colorspace=cs, dst_color_range=cr)
    geometry = Nv12Geometry.of((640, 360), (640, 640), matrix, colour_range, bits=10)
    rgb = p016_to_rgb_u8(_p016_of(ten), geometry).numpy().transpose(1, 2, 0)[:, :, ::-1]
    exact = np.abs(rgb.astype(int) - _independent_bgr10(ten.to_ndarray(), matrix, colour_range))
    assert exact.max() <= 1 and (exact > 0).mean() < 0.01
    sws = ten.reformat(
        format="bgr24", src_colorspace=cs, src_color_range=cr, interpolation="POINT"
    ).to_ndarray()
    diff = np.abs(rgb.astype(int) - sws.astype(int))
    assert diff.max() <= 3 and diff.mean() < 1.5


def test_p016_equals_nv12_shifted_up_in_limited_range() -> None:
    nv12 = _random_nv12(64, 48, 5)
    geometry = Nv12Geometry.of((64, 48), (64, 64), ColourMatrix.BT709, ColourRange.LIMITED)
    p016 = (nv12.numpy().astype(np.uint32) << 8).astype(np.uint16)  # 8 -> 16 bits, exact
    for bits in (10, 12, 16):  # limited range: the same value at any depth
        ten = p016_to_rgb_u8(torch.from_numpy(p016), replace(geometry, bits=bits))
        assert torch.equal(ten, nv12_to_rgb_u8(nv12, geometry))


def test_p016_rejects_other_surfaces() -> None:
    geometry = Nv12Geometry.of((4, 4), (8, 8), ColourMatrix.BT709, ColourRange.LIMITED, bits=10)
    with pytest.raises(ValueError, match="uint16"):
        p016_to_rgb_u8(torch.zeros((6, 4), dtype=torch.uint8), geometry)
    with pytest.raises(ValueError, match=r"bits 9\.\.16"):
        p016_to_rgb_u8(torch.zeros((6, 4), dtype=torch.uint16), replace(geometry, bits=8))
    with pytest.raises(ValueError, match="8- to 16-bit"):
        Nv12Geometry.of((4, 4), (8, 8), bits=17)


@pytest.mark.parametrize("bits", [10, 12])
@pytest.mark.parametrize("matrix", list(ColourMatrix))
@pytest.mark.parametrize("colour_range", list(ColourRange))
def test_p016_torch_reference_equals_the_kernels_numpy_one(
    bits: int, matrix: ColourMatrix, colour_range: ColourRange
) -> None:
    """The torch reference (what the graph runners fall back to) and vdet.cuda.ops'
    `p016_to_bgr` (what the kernel tests hold the P016 kernel to) agree bit for bit, noise
    below the sample bits included; `surface_to_rgb_u8` picks it by the geometry's bits."""
    rng = np.random.default_rng(bits)
    h, w = 36, 50
    surface = rng.integers(0, 1 << 16, (h * 3 // 2, w), dtype=np.uint16)
    geometry = Nv12Geometry.of((w, h), (64, 64), matrix, colour_range, bits=bits)
    rgb = surface_to_rgb_u8(torch.from_numpy(surface), geometry)
    want = p016_to_bgr(
        surface[:h],
        surface[h:],
        yuv_coefficients(matrix, colour_range),
        sample_scale(bits, colour_range),
    )
    got = rgb.numpy().transpose(1, 2, 0)[:, :, ::-1].astype(np.uint8)
    np.testing.assert_array_equal(got, want)


def test_p016_letterbox_reference_matches_the_cpu_letterbox() -> None:
    """`nv12_letterbox_reference` on a P016 geometry: the CPU `letterbox` of the converted
    image, padding exact and the resized area within one level."""
    rng = np.random.default_rng(3)
    h, w = 90, 160
    surface = (rng.integers(0, 1 << 10, (h * 3 // 2, w), dtype=np.uint16) << 6).astype(np.uint16)
    geometry = Nv12Geometry.of((w, h), (64, 64), ColourMatrix.BT709, ColourRange.LIMITED, bits=10)
    out = torch.full((3, 64, 64), float("nan"))
    nv12_letterbox_reference(torch.from_numpy(surface), geometry, out)
    bgr = p016_to_bgr(
        surface[:h],
        surface[h:],
        yuv_coefficients(ColourMatrix.BT709, ColourRange.LIMITED),
        sample_scale(10, ColourRange.LIMITED),
    )
    want, _ = letterbox(bgr, (64, 64))
    assert np.abs(out.numpy() - want).max() <= 1 / 255 + 1e-6
