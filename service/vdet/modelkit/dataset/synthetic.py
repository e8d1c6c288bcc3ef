"""Synthetic scenes with exact ground truth: the project's own data for training and testing.

No labelled dataset can be downloaded where vdet is built, so the demo model, every accuracy
claim and every end-to-end test rest on scenes rendered here, deterministically from a seed.

Design choices, each for a failure it exposes:
- Classes differ by shape AND colour, and two pairs share a shape with red and blue swapped
  (red/blue circle, orange/azure square): an RGB/BGR swap or a chroma bug in a decoder or a
  kernel flips those classes instead of passing silently.
- Backgrounds are textured (smooth colour fields, grain, line clutter) and carry grey, desaturated
  distractor shapes, so the detector has to use colour as well as shape.
- Objects span about 16 px to 400 px at 1080p, may overlap (occluders keep at least
  `min_visible_fraction` of what they cover visible) and, in videos, move and bounce.

Box convention: integer pixel edges, xyxy, `x2 = last covered column + 1`; boxes are the full
(amodal) extent of each object's rasterised mask, so they are exact, not estimated.
This module only renders; writing datasets and clips lives in `vdet.modelkit.dataset.writers`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace

import cv2
import numpy as np
import numpy.typing as npt

from vdet.core.types import ImageArray

CLASS_NAMES: tuple[str, ...] = (
    "red_circle",
    "blue_circle",
    "green_triangle",
    "orange_square",
    "azure_square",
    "yellow_star",
)

# RGB base colours. Pairs (0, 1) and (3, 4) are each other's R<->B swap on purpose.
_CLASS_RGB: tuple[tuple[int, int, int], ...] = (
    (215, 35, 35),
    (35, 35, 215),
    (40, 175, 60),
    (240, 135, 20),
    (20, 135, 240),
    (235, 215, 30),
)
_CLASS_SHAPE: tuple[str, ...] = ("circle", "circle", "triangle", "square", "square", "star")


@dataclass(frozen=True)
class SceneConfig:
    """Knobs of the generator; defaults are the distribution the demo model is trained on."""

    width: int = 1920
    height: int = 1080
    min_objects: int = 3
    max_objects: int = 14
    min_size: float = 16.0
    max_size: float = 400.0
    min_visible_fraction: float = 0.6
    distractors: tuple[int, int] = (4, 14)
    noise_sigma: float = 5.0
    blur_sigma: float = 0.6

    def __post_init__(self) -> None:
        if not (16 <= self.width <= 8192 and 16 <= self.height <= 8192):
            raise ValueError(f"frame size {self.width}x{self.height} out of range 16..8192")
        if not 0 < self.min_size <= self.max_size:
            raise ValueError("need 0 < min_size <= max_size")
        if not 0 <= self.min_objects <= self.max_objects:
            raise ValueError("need 0 <= min_objects <= max_objects")


@dataclass(frozen=True)
class SceneObject:
    """One object's pose; `size` is the diameter of its circumscribed circle in pixels."""

    class_id: int
    cx: float
    cy: float
    size: float
    angle: float
    rgb: tuple[int, int, int]
    vx: float = 0.0
    vy: float = 0.0
    spin: float = 0.0
    identity: int | None = None  # videos: the object's ground-truth track id

    def moved(self, width: int, height: int) -> SceneObject:
        """The pose one frame later, bouncing off the frame's edges."""
        r = self.size / 2
        cx, vx = _bounce(self.cx + self.vx, self.vx, r, width - r)
        cy, vy = _bounce(self.cy + self.vy, self.vy, r, height - r)
        return SceneObject(
            self.class_id,
            cx,
            cy,
            self.size,
            self.angle + self.spin,
            self.rgb,
            vx,
            vy,
            self.spin,
            self.identity,
        )


@dataclass(frozen=True)
class Annotation:
    class_id: int
    xyxy: tuple[int, int, int, int]
    visible_fraction: float
    track_id: int | None = None  # videos: the same object has the same id on every frame

    @property
    def class_name(self) -> str:
        return CLASS_NAMES[self.class_id]

    @property
    def size(self) -> int:
        return max(self.xyxy[2] - self.xyxy[0], self.xyxy[3] - self.xyxy[1])


@dataclass(frozen=True)
class RenderedScene:
    image_bgr: ImageArray
    annotations: tuple[Annotation, ...]


def _bounce(pos: float, vel: float, lo: float, hi: float) -> tuple[float, float]:
    if pos < lo:
        return lo + (lo - pos), abs(vel)
    if pos > hi:
        return hi - (pos - hi), -abs(vel)
    return pos, vel


def _shape_polygon(shape: str, cx: float, cy: float, size: float, angle: float) -> np.ndarray:
    r = size / 2
    if shape == "circle":
        n = max(24, int(r * 1.5))
        t = np.linspace(0, 2 * math.pi, n, endpoint=False)
        radii = np.full(n, r)
    elif shape == "triangle":
        t = angle + np.arange(3) * 2 * math.pi / 3
        radii = np.full(3, r)
    elif shape == "square":
        t = angle + math.pi / 4 + np.arange(4) * math.pi / 2
        radii = np.full(4, r)
    elif shape == "star":
        t = angle + np.arange(10) * math.pi / 5
        radii = np.where(np.arange(10) % 2 == 0, r, r * 0.45)
    else:
        raise ValueError(f"unknown shape {shape!r}")
    return np.stack([cx + radii * np.cos(t), cy + radii * np.sin(t)], axis=1)


def _rasterise(polygon: np.ndarray, width: int, height: int) -> tuple[np.ndarray, int, int] | None:
    """The polygon's mask inside its clipped bounding rectangle, and that rectangle's origin."""
    x0 = max(math.floor(polygon[:, 0].min()) - 1, 0)
    y0 = max(math.floor(polygon[:, 1].min()) - 1, 0)
    x1 = min(math.ceil(polygon[:, 0].max()) + 2, width)
    y1 = min(math.ceil(polygon[:, 1].max()) + 2, height)
    if x1 <= x0 or y1 <= y0:
        return None
    mask = np.zeros((y1 - y0, x1 - x0), np.uint8)
    shift = 4  # sub-pixel vertex precision: 1/16 px
    pts = np.round((polygon - [x0, y0]) * (1 << shift)).astype(np.int32)
    cv2.fillPoly(mask, [pts], 1, lineType=cv2.LINE_8, shift=shift)
    if not mask.any():
        return None
    return mask, x0, y0


def _smooth_field(
    rng: np.random.Generator, width: int, height: int, cells: tuple[int, int], channels: int
) -> np.ndarray:
    small = rng.random((cells[1], cells[0], channels), dtype=np.float32)
    field: np.ndarray = cv2.resize(small, (width, height), interpolation=cv2.INTER_CUBIC).reshape(
        height, width, channels
    )
    return field


def render_background(rng: np.random.Generator, config: SceneConfig) -> np.ndarray:
    """A muted, textured float32 HxWx3 BGR background with desaturated clutter."""
    w, h = config.width, config.height
    base = rng.uniform(60, 170, size=3).astype(np.float32)
    tint = rng.uniform(0.25, 0.6)
    colour_field = _smooth_field(rng, w, h, (int(rng.integers(3, 9)), int(rng.integers(2, 6))), 3)
    grain = _smooth_field(rng, w, h, (w // 24, h // 24), 1)
    img = base * (0.55 + 0.9 * colour_field * tint + (1 - tint) * 0.45)
    img += (grain - 0.5) * rng.uniform(10, 40)
    grey = img.mean(axis=2, keepdims=True)
    img = grey + (img - grey) * 0.35  # keep the background far from the class colours
    for _ in range(int(rng.integers(*config.distractors))):
        level = float(rng.uniform(30, 220))
        colour = (level, level * rng.uniform(0.9, 1.1), level * rng.uniform(0.9, 1.1))
        kind = int(rng.integers(0, 4))
        cx, cy = float(rng.uniform(0, w)), float(rng.uniform(0, h))
        size = float(np.exp(rng.uniform(np.log(12), np.log(300))))
        if kind == 3:
            p2 = (int(cx + rng.uniform(-400, 400)), int(cy + rng.uniform(-400, 400)))
            cv2.line(img, (int(cx), int(cy)), p2, colour, int(rng.integers(1, 6)))
        else:
            shape = ("circle", "triangle", "square")[kind]
            poly = _shape_polygon(shape, cx, cy, size, float(rng.uniform(0, 2 * math.pi)))
            cv2.fillPoly(img, [np.round(poly).astype(np.int32)], colour)
    background: np.ndarray = img
    return background


def random_objects(
    rng: np.random.Generator, config: SceneConfig, count: int | None = None, max_speed: float = 0.0
) -> list[SceneObject]:
    """Random object poses (not yet checked for occlusion; `render` rejects over-occluders)."""
    n = int(rng.integers(config.min_objects, config.max_objects + 1)) if count is None else count
    objects = []
    for _ in range(n):
        class_id = int(rng.integers(0, len(CLASS_NAMES)))
        size = float(np.exp(rng.uniform(np.log(config.min_size), np.log(config.max_size))))
        size = min(size, 0.9 * min(config.width, config.height))
        r = size / 2
        jitter = rng.integers(-18, 19, size=3)
        rgb = tuple(
            int(np.clip(c + j, 0, 255)) for c, j in zip(_CLASS_RGB[class_id], jitter, strict=True)
        )
        speed = float(rng.uniform(0.3, 1.0)) * max_speed
        heading = float(rng.uniform(0, 2 * math.pi))
        objects.append(
            SceneObject(
                class_id=class_id,
                cx=float(rng.uniform(r, config.width - r)),
                cy=float(rng.uniform(r, config.height - r)),
                size=size,
                angle=float(rng.uniform(0, 2 * math.pi)),
                rgb=(rgb[0], rgb[1], rgb[2]),
                vx=speed * math.cos(heading),
                vy=speed * math.sin(heading),
                spin=float(rng.uniform(-0.03, 0.03)) if max_speed else 0.0,
            )
        )
    return objects


def render(
    background: np.ndarray,
    objects: list[SceneObject],
    rng: np.random.Generator,
    config: SceneConfig,
    enforce_visibility: bool = True,
) -> tuple[RenderedScene, list[SceneObject]]:
    """Draw objects in order over the background; returns the scene and the objects kept.

    With `enforce_visibility`, an object that would leave any earlier one less than
    `min_visible_fraction` visible is skipped (still images); videos pass False and record each
    object's visible fraction instead, since moving objects must be allowed to pass each other.
    """
    h, w = config.height, config.width
    img = background.copy()
    owner = np.full((h, w), -1, np.int32)  # index of the topmost object at each pixel
    visible: list[int] = []  # pixels of each kept object still on top, kept up to date
    areas: list[int] = []
    boxes: list[tuple[int, int, int, int]] = []
    kept: list[SceneObject] = []
    for obj in objects:
        poly = _shape_polygon(_CLASS_SHAPE[obj.class_id], obj.cx, obj.cy, obj.size, obj.angle)
        raster = _rasterise(poly, w, h)
        if raster is None:
            continue
        mask, x0, y0 = raster
        region = owner[y0 : y0 + mask.shape[0], x0 : x0 + mask.shape[1]]
        sel = mask.astype(bool)
        covered = region[sel]
        lost = np.bincount(covered[covered >= 0], minlength=len(kept))
        if enforce_visibility and lost.any():
            remaining = np.asarray(visible) - lost
            if (remaining < config.min_visible_fraction * np.asarray(areas)).any():
                continue
        visible = [v - int(n) for v, n in zip(visible, lost, strict=True)]
        region[sel] = len(kept)
        ys, xs = np.nonzero(mask)
        boxes.append(
            (x0 + int(xs.min()), y0 + int(ys.min()), x0 + int(xs.max()) + 1, y0 + int(ys.max()) + 1)
        )
        areas.append(int(sel.sum()))
        visible.append(areas[-1])
        kept.append(obj)
        _paint(img, mask, x0, y0, obj, rng)
    annotations = tuple(
        Annotation(o.class_id, boxes[i], round(float(visible[i]) / areas[i], 4), o.identity)
        for i, o in enumerate(kept)
    )
    return RenderedScene(_finish(img, rng, config), annotations), kept


def _paint(
    img: np.ndarray, mask: np.ndarray, x0: int, y0: int, obj: SceneObject, rng: np.random.Generator
) -> None:
    """Fill the object with its colour under a gentle lighting gradient (BGR image)."""
    mh, mw = mask.shape
    gx, gy = np.meshgrid(
        np.linspace(-1, 1, mw, dtype=np.float32), np.linspace(-1, 1, mh, dtype=np.float32)
    )
    light = 1.0 + 0.12 * (gx * math.cos(obj.angle) + gy * math.sin(obj.angle))
    bgr = np.array(obj.rgb[::-1], np.float32)
    patch = img[y0 : y0 + mh, x0 : x0 + mw]
    sel = mask.astype(bool)
    patch[sel] = (light[..., None] * bgr)[sel]


def _finish(img: np.ndarray, rng: np.random.Generator, config: SceneConfig) -> ImageArray:
    if config.blur_sigma > 0:
        img = cv2.GaussianBlur(img, (0, 0), config.blur_sigma)
    if config.noise_sigma > 0:
        img += rng.standard_normal(img.shape, dtype=np.float32) * np.float32(config.noise_sigma)
    out: ImageArray = np.clip(img, 0, 255).astype(np.uint8)
    return out


def render_image(seed: int, config: SceneConfig | None = None) -> RenderedScene:
    """One still scene, fully determined by `seed`."""
    config = config or SceneConfig()
    rng = np.random.default_rng(seed)
    background = render_background(rng, config)
    scene, _ = render(background, random_objects(rng, config), rng, config)
    return scene


@dataclass(frozen=True)
class VideoFrameTruth:
    index: int
    pts_seconds: float
    annotations: tuple[Annotation, ...]


def render_video(
    seed: int,
    num_frames: int,
    fps: float = 30.0,
    config: SceneConfig | None = None,
    max_speed: float = 9.0,
) -> tuple[list[ImageArray], list[VideoFrameTruth]]:
    """Frames of one clip (a static background, moving objects) and their ground truth,
    with each object's identity (`Annotation.track_id`, 1..n) the same on every frame.

    The background and its grain are fixed per clip, as a fixed camera sees them, and only a
    little sensor noise changes per frame: the clip then compresses like real footage.
    """
    frames: list[ImageArray] = []
    truth: list[VideoFrameTruth] = []
    for image, frame_truth in iter_video(seed, num_frames, fps, config, max_speed):
        frames.append(image)
        truth.append(frame_truth)
    return frames, truth


def iter_video(
    seed: int,
    num_frames: int,
    fps: float = 30.0,
    config: SceneConfig | None = None,
    max_speed: float = 9.0,
) -> Iterator[tuple[ImageArray, VideoFrameTruth]]:
    """`render_video` one frame at a time (a long 1080p clip does not fit in memory)."""
    config = config or SceneConfig()
    rng = np.random.default_rng(seed)
    background = render_background(rng, config)
    objects = random_objects(rng, config, max_speed=max_speed)
    scene, objects = render(background, objects, rng, config)  # a clean first frame
    objects = [replace(o, identity=i) for i, o in enumerate(objects, start=1)]
    frame_config = SceneConfig(**{**config.__dict__, "noise_sigma": min(config.noise_sigma, 2.0)})
    for i in range(num_frames):
        scene, _ = render(background, objects, rng, frame_config, enforce_visibility=False)
        yield scene.image_bgr, VideoFrameTruth(i, i / fps, scene.annotations)
        objects = [o.moved(config.width, config.height) for o in objects]


def class_colour_bgr(class_id: int) -> tuple[int, int, int]:
    r, g, b = _CLASS_RGB[class_id]
    return b, g, r


def mask_bbox(mask: npt.NDArray[np.bool_]) -> tuple[int, int, int, int] | None:
    """Pixel-edge xyxy of a boolean mask, or None when it is empty (used by tests)."""
    ys, xs = np.nonzero(mask)
    if len(xs) == 0:
        return None
    return int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1
