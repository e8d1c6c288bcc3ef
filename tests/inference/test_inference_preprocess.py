"""Letterbox geometry, pixels and the way back, against hand-computed cases and Ultralytics."""

from __future__ import annotations

import numpy as np
import pytest

from vdet.inference.preprocess import (
    PAD_VALUE,
    LetterboxTransform,
    compute_letterbox,
    letterbox,
    letterbox_batch,
)

PAD = np.float32(PAD_VALUE) / np.float32(255)


@pytest.mark.parametrize(
    ("source_wh", "input_hw", "gain", "resized_wh", "pad_xy"),
    [
        # 16:9 into a square: scaled down, letterboxed top and bottom
        ((1920, 1080), (640, 640), 1 / 3, (640, 360), (0, 140)),
        # no resize, only padding
        ((640, 480), (640, 640), 1.0, (640, 480), (0, 80)),
        # scaled up
        ((517, 333), (640, 640), 640 / 517, (640, 412), (0, 114)),
        # odd leftover: dh = 15.5 -> top 15, bottom 16
        ((100, 51), (64, 64), 0.64, (64, 33), (0, 15)),
        # h * r = 2.5 rounds half to even (2), as Python's round does
        ((4, 5), (8, 2), 0.5, (2, 2), (0, 3)),
        # very thin images keep at least one pixel
        ((3000, 1), (640, 640), 640 / 3000, (640, 1), (0, 319)),
        ((1, 3000), (640, 640), 640 / 3000, (1, 640), (319, 0)),
        # non-square network input
        ((1280, 720), (384, 640), 0.5, (640, 360), (0, 12)),
        ((720, 1280), (384, 640), 0.3, (216, 384), (212, 0)),
    ],
)
def test_compute_letterbox_hand_cases(
    source_wh: tuple[int, int],
    input_hw: tuple[int, int],
    gain: float,
    resized_wh: tuple[int, int],
    pad_xy: tuple[int, int],
) -> None:
    t = compute_letterbox(source_wh, input_hw)
    assert t.gain == pytest.approx(gain)
    assert t.resized_wh == resized_wh
    assert (t.pad_x, t.pad_y) == pad_xy
    assert t.input_hw == input_hw
    assert t.source_wh == source_wh


@pytest.mark.parametrize(
    ("source_wh", "input_hw"),
    [((0, 10), (640, 640)), ((10, 0), (640, 640)), ((10, 10), (0, 640)), ((10, 10), (640, 0))],
)
def test_compute_letterbox_rejects_empty_sizes(
    source_wh: tuple[int, int], input_hw: tuple[int, int]
) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        compute_letterbox(source_wh, input_hw)


def test_letterbox_pixels_by_hand() -> None:
    # 2x2 image into 2x4: no resize, one pad column each side, BGR -> RGB, /255.
    image = np.arange(12, dtype=np.uint8).reshape(2, 2, 3) * 20
    out, t = letterbox(image, (2, 4))
    assert (t.pad_x, t.pad_y, t.resized_wh) == (1, 0, (2, 2))
    assert out.shape == (3, 2, 4)
    assert out.dtype == np.float32
    expected = np.full((3, 2, 4), PAD, np.float32)
    for c in range(3):
        expected[c, :, 1:3] = image[:, :, 2 - c].astype(np.float32) / np.float32(255)
    np.testing.assert_array_equal(out, expected)


def test_letterbox_uses_true_division() -> None:
    # 1/255 multiplication differs from division in the last bit for about half of all values.
    image = np.arange(256, dtype=np.uint8).reshape(16, 16, 1).repeat(3, axis=2)
    out, _ = letterbox(image, (16, 16))
    expected = np.arange(256, dtype=np.float32).reshape(16, 16) / np.float32(255)
    np.testing.assert_array_equal(out[0], expected)


def test_letterbox_writes_into_out() -> None:
    out = np.full((3, 8, 8), -1, np.float32)
    image = np.zeros((4, 8, 3), np.uint8)
    returned, _ = letterbox(image, (8, 8), out=out)
    assert returned is out
    assert (out >= 0).all()  # every pixel written, padding included


@pytest.mark.parametrize(
    ("image", "out", "match"),
    [
        (np.zeros((4, 4), np.uint8), None, "HxWx3 uint8"),
        (np.zeros((4, 4, 4), np.uint8), None, "HxWx3 uint8"),
        (np.zeros((4, 4, 3), np.float32), None, "HxWx3 uint8"),
        (np.zeros((0, 4, 3), np.uint8), None, "must be positive"),
        (np.zeros((4, 4, 3), np.uint8), np.zeros((3, 8, 9), np.float32), "out must be"),
        (np.zeros((4, 4, 3), np.uint8), np.zeros((3, 8, 8), np.float64), "out must be"),
    ],
)
def test_letterbox_rejects_bad_arguments(
    image: np.ndarray, out: np.ndarray | None, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        letterbox(image, (8, 8), out=out)


@pytest.mark.parametrize("count", [0, 1, 3])
def test_letterbox_batch_matches_single(count: int) -> None:
    rng = np.random.default_rng(count)
    sizes = [(48, 64), (64, 48), (10, 100)][:count]
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]
    batch, transforms = letterbox_batch(images, (32, 40))
    assert batch.shape == (count, 3, 32, 40)
    assert batch.dtype == np.float32
    assert len(transforms) == count
    for image, row, t in zip(images, batch, transforms, strict=True):
        single, single_t = letterbox(image, (32, 40))
        np.testing.assert_array_equal(row, single)
        assert t == single_t


SIZES_HW = [(480, 640), (1080, 1920), (333, 517), (640, 640), (1, 3000), (3000, 1), (7, 5)]
INPUTS_HW = [(640, 640), (384, 640), (320, 256)]


@pytest.mark.parametrize("input_hw", INPUTS_HW)
@pytest.mark.parametrize("source_hw", SIZES_HW)
def test_letterbox_matches_ultralytics(
    source_hw: tuple[int, int], input_hw: tuple[int, int]
) -> None:
    augment = pytest.importorskip("ultralytics.data.augment")
    rng = np.random.default_rng(source_hw[0] * 7919 + source_hw[1])
    image = rng.integers(0, 256, (*source_hw, 3), dtype=np.uint8)
    reference_bgr = augment.LetterBox(input_hw, auto=False, scaleup=True, center=True)(image=image)
    # What Ultralytics' predictor does next: BGR -> RGB, HWC -> CHW, float, / 255.
    reference = reference_bgr[..., ::-1].transpose(2, 0, 1).astype(np.float32) / np.float32(255)
    out, _ = letterbox(image, input_hw)
    np.testing.assert_array_equal(out, reference)


BOXES = [
    np.zeros((0, 4), np.float32),
    np.array([[0, 0, 10, 10]], np.float32),
    np.array([[5.5, 7.25, 600, 400], [0, 0, 1, 1], [100, 50, 101, 51]], np.float32),
]


@pytest.mark.parametrize("boxes", BOXES, ids=["empty", "one", "three"])
@pytest.mark.parametrize(
    ("source_wh", "input_hw"),
    [((640, 480), (640, 640)), ((1920, 1080), (384, 640)), ((613, 401), (320, 320))],
)
def test_transform_round_trip(
    boxes: np.ndarray, source_wh: tuple[int, int], input_hw: tuple[int, int]
) -> None:
    t = compute_letterbox(source_wh, input_hw)
    inside = boxes.copy()
    inside[:, 0::2] = np.minimum(inside[:, 0::2], source_wh[0])
    inside[:, 1::2] = np.minimum(inside[:, 1::2], source_wh[1])
    back = t.to_source(t.to_input(inside))
    assert back.shape == inside.shape
    assert back.dtype == np.float32
    np.testing.assert_allclose(back, inside, atol=1e-3)


def test_to_source_clips_to_image() -> None:
    t = compute_letterbox((640, 480), (640, 640))  # pad_y = 80
    boxes = np.array([[-10, 0, 700, 639], [10, 100, 20, 110]], np.float32)
    np.testing.assert_allclose(
        t.to_source(boxes), np.array([[0, 0, 640, 480], [10, 20, 20, 30]], np.float32)
    )


def test_to_source_uses_the_exact_per_axis_scale() -> None:
    # 1001 x 500 -> 640: gain 0.6394; resized 640 x 320, so y scales by 320 / 500, not by gain.
    t = compute_letterbox((1001, 500), (640, 640))
    assert t.scale_xy == (640 / 1001, 320 / 500)
    bottom_edge = np.array([[0, t.pad_y, 640, t.pad_y + 320]], np.float32)
    np.testing.assert_allclose(t.to_source(bottom_edge), [[0, 0, 1001, 500]], rtol=1e-6)


@pytest.mark.parametrize("shape", [(4,), (2, 3), (1, 2, 4)])
def test_transform_rejects_bad_box_shapes(shape: tuple[int, ...]) -> None:
    t = compute_letterbox((10, 10), (10, 10))
    with pytest.raises(ValueError, match=r"shape \(n, 4\)"):
        t.to_source(np.zeros(shape, np.float32))


@pytest.mark.parametrize(
    ("source_wh", "input_hw"),
    [
        ((640, 480), (640, 640)),
        ((1920, 1080), (640, 640)),
        ((517, 333), (384, 640)),
        ((1001, 500), (640, 640)),
    ],
)
def test_to_source_matches_ultralytics_scale_boxes(
    source_wh: tuple[int, int], input_hw: tuple[int, int]
) -> None:
    ops = pytest.importorskip("ultralytics.utils.ops")
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    xy = rng.uniform(-20, max(input_hw) + 20, (50, 2))
    wh = rng.uniform(0, 200, (50, 2))
    boxes = np.concatenate([xy, xy + wh], axis=1).astype(np.float32)
    w, h = source_wh
    reference = ops.scale_boxes(input_hw, torch.from_numpy(boxes.copy()), (h, w)).numpy()
    t = compute_letterbox(source_wh, input_hw)
    np.testing.assert_allclose(t.to_source(boxes), reference, rtol=1e-6, atol=1e-4)


def test_transform_is_a_frozen_value() -> None:
    t = LetterboxTransform(gain=0.5, pad_x=0, pad_y=12, input_hw=(384, 640), source_wh=(1280, 720))
    assert t == compute_letterbox((1280, 720), (384, 640))
    with pytest.raises(AttributeError):
        t.gain = 1.0  # type: ignore[misc]
