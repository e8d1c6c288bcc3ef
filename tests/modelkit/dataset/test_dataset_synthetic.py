"""The synthetic scene generator: determinism, exact labels, the class design, clips."""

from __future__ import annotations

import json
from pathlib import Path

import av
import numpy as np
import pytest

from vdet.modelkit.dataset.synthetic import (
    CLASS_NAMES,
    SceneConfig,
    class_colour_bgr,
    mask_bbox,
    random_objects,
    render,
    render_background,
    render_image,
    render_video,
)
from vdet.modelkit.dataset.writers import write_dataset, write_video_with_truth

SMALL = SceneConfig(width=480, height=270, min_size=12, max_size=120)


def test_same_seed_same_scene() -> None:
    a, b = render_image(7, SMALL), render_image(7, SMALL)
    assert np.array_equal(a.image_bgr, b.image_bgr)
    assert a.annotations == b.annotations


def test_different_seeds_differ() -> None:
    assert not np.array_equal(render_image(1, SMALL).image_bgr, render_image(2, SMALL).image_bgr)


@pytest.mark.parametrize("seed", range(6))
def test_boxes_are_the_exact_extent_of_the_rendered_pixels(seed: int) -> None:
    """Render without blur and noise; the pixels that objects changed give each box exactly."""
    config = SceneConfig(
        width=640,
        height=360,
        min_size=10,
        max_size=150,
        blur_sigma=0.0,
        noise_sigma=0.0,
        min_visible_fraction=1.0,
    )
    rng = np.random.default_rng(seed)
    background = render_background(rng, config)
    objects = random_objects(rng, config, count=8)
    scene, _ = render(background, objects, rng, config)
    bare = np.clip(background, 0, 255).astype(np.uint8)
    changed = (scene.image_bgr != bare).any(axis=2)
    assert scene.annotations, "expected some objects"
    for ann in scene.annotations:
        x1, y1, x2, y2 = ann.xyxy
        assert ann.visible_fraction == 1.0
        # The changed pixels inside a 2 px ring around the box belong to this object alone
        # unless another box is that close, so only isolated objects are compared.
        others = [o.xyxy for o in scene.annotations if o is not ann]
        if any(_overlaps(ann.xyxy, o, margin=3) for o in others):
            continue
        window = changed[max(y1 - 3, 0) : y2 + 3, max(x1 - 3, 0) : x2 + 3]
        found = mask_bbox(window)
        assert found is not None
        fx1, fy1, fx2, fy2 = found
        ox, oy = max(x1 - 3, 0), max(y1 - 3, 0)
        # A pixel whose object colour equals the background's rounds to "unchanged": allow 1 px.
        assert abs(fx1 + ox - x1) <= 1 and abs(fy1 + oy - y1) <= 1
        assert abs(fx2 + ox - x2) <= 1 and abs(fy2 + oy - y2) <= 1


def _overlaps(a: tuple[int, ...], b: tuple[int, ...], margin: int) -> bool:
    return not (
        a[2] + margin <= b[0]
        or b[2] + margin <= a[0]
        or a[3] + margin <= b[1]
        or b[3] + margin <= a[1]
    )


def test_occlusion_is_bounded_in_stills() -> None:
    config = SceneConfig(min_objects=14, max_objects=14)
    for seed in range(3):
        for ann in render_image(seed, config).annotations:
            assert ann.visible_fraction >= config.min_visible_fraction


def test_object_sizes_span_the_configured_range() -> None:
    sizes = [a.size for s in range(30) for a in render_image(s).annotations]
    assert min(sizes) < 24 and max(sizes) > 200
    assert all(10 <= s <= 420 for s in sizes)


def test_swapped_pairs_are_red_blue_mirrors() -> None:
    """An RGB/BGR swap turns red_circle into blue_circle and orange into azure squares."""
    for a, b in ((0, 1), (3, 4)):
        assert class_colour_bgr(a) == class_colour_bgr(b)[::-1]
    assert len(set(CLASS_NAMES)) == len(CLASS_NAMES)


def test_dataset_files_are_deterministic(tmp_path: Path) -> None:
    seeds = {"val": range(3)}
    one = write_dataset(tmp_path / "a", seeds, SMALL, workers=1)["val"]
    two = write_dataset(tmp_path / "b", seeds, SMALL, workers=2)["val"]
    for name in ("images/val/val_0000000.jpg", "labels/val/val_0000002.txt"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    coco = json.loads(one.read_text())
    assert coco == json.loads(two.read_text())
    assert [c["name"] for c in coco["categories"]] == list(CLASS_NAMES)
    # COCO and YOLO labels describe the same boxes.
    first = coco["images"][0]
    anns = [a for a in coco["annotations"] if a["image_id"] == first["id"]]
    lines = (tmp_path / "a/labels/val/val_0000000.txt").read_text().split("\n")
    for ann, line in zip(anns, filter(None, lines), strict=True):
        cls, cx, _, _, h = (float(v) for v in line.split())
        x, _, bw, bh = ann["bbox"]
        assert cls == ann["category_id"]
        assert cx * SMALL.width == pytest.approx(x + bw / 2, abs=1e-3)
        assert h * SMALL.height == pytest.approx(bh, abs=1e-3)


def test_video_objects_move_and_truth_matches_frames(tmp_path: Path) -> None:
    frames, truth = render_video(3, 12, config=SMALL, max_speed=6)
    assert len(frames) == len(truth) == 12
    first, last = truth[0].annotations, truth[-1].annotations
    assert len(first) == len(last) > 0
    assert any(a.xyxy != b.xyxy for a, b in zip(first, last, strict=True))
    clip = tmp_path / "clip.mp4"
    truth_path = write_video_with_truth(clip, seed=3, seconds=0.4, fps=30, config=SMALL)
    data = json.loads(truth_path.read_text())
    assert data["width"] == SMALL.width and len(data["frames"]) == 12
    with av.open(str(clip)) as container:
        stream = container.streams.video[0]
        decoded = sum(1 for _ in container.decode(stream))
        assert (stream.width, stream.height) == (SMALL.width, SMALL.height)
    assert decoded == 12


def test_bad_config_is_rejected() -> None:
    with pytest.raises(ValueError, match="min_size"):
        SceneConfig(min_size=50, max_size=10)
    with pytest.raises(ValueError, match="out of range"):
        SceneConfig(width=4)
