"""A synthetic clip made for counting: objects in lanes cross a known line and enter a known
zone, and the generator says how many of each class do so, in which direction.

Each object moves in a straight line at constant speed along its own horizontal lane (lanes
are further apart than the largest object, so nobody hides anybody), starting and ending well
away from the line and the zone's borders, so the answer does not hinge on a pixel. Some lanes
pass beyond the line's end, where crossing does not count. The expected counts are computed
here from the objects' exact boxes with plain arithmetic, independently of vdet.tracking.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator

import numpy as np

from vdet.core.types import ImageArray
from vdet.modelkit.dataset.synthetic import (
    CLASS_NAMES,
    SceneConfig,
    SceneObject,
    VideoFrameTruth,
    class_colour_bgr,
    render,
    render_background,
)

LINE_X = 960.0
LINE_Y = (80.0, 760.0)  # the line's ends: lanes below y = 760 pass beyond it
ZONE_X = (1300.0, 1750.0)
ZONE_Y = (80.0, 1000.0)
LANES_Y = (140.0, 260.0, 380.0, 500.0, 620.0, 740.0, 860.0, 980.0)
_MARGIN = 70.0  # no object starts or ends closer than this to the line or a zone border


def counting_zones() -> list[dict[str, object]]:
    """The line "gate" (drawn top to bottom: moving right to left is "in") and the zone "pen"."""
    x0, x1 = ZONE_X
    y0, y1 = ZONE_Y
    return [
        {
            "id": "gate",
            "kind": "line",
            "normalized": False,
            "points": [[LINE_X, LINE_Y[0]], [LINE_X, LINE_Y[1]]],
        },
        {
            "id": "pen",
            "kind": "polygon",
            "normalized": False,
            "points": [[x0, y0], [x1, y0], [x1, y1], [x0, y1]],
        },
    ]


def _clear(x: float) -> bool:
    return all(abs(x - edge) > _MARGIN for edge in (LINE_X, *ZONE_X))


def iter_counting_video(
    seed: int, num_frames: int = 180, fps: float = 30.0
) -> Iterator[tuple[ImageArray, VideoFrameTruth]]:
    """One 1920x1080 counting clip, frame by frame, fully determined by `seed`; its zones are
    `counting_zones()` and `expected_counts` of its truth is the answer."""
    config = SceneConfig()
    rng = np.random.default_rng(seed)
    background = render_background(rng, config)
    objects = []
    for identity, lane_y in enumerate(LANES_Y, start=1):
        class_id = int(rng.integers(0, len(CLASS_NAMES)))
        size = float(rng.uniform(50, 90))
        r = size / 2
        while True:
            start, end = (float(v) for v in rng.uniform(r + 10, config.width - r - 10, size=2))
            if abs(end - start) > 300 and _clear(start) and _clear(end):
                break
        objects.append(
            SceneObject(
                class_id=class_id,
                cx=start,
                cy=lane_y,
                size=size,
                angle=float(rng.uniform(0, 2 * np.pi)),
                rgb=class_colour_bgr(class_id)[::-1],
                vx=(end - start) / (num_frames - 1),
                identity=identity,
            )
        )
    frame_config = SceneConfig(noise_sigma=2.0)
    for i in range(num_frames):
        scene, _ = render(background, objects, rng, frame_config, enforce_visibility=False)
        yield scene.image_bgr, VideoFrameTruth(i, i / fps, scene.annotations)
        objects = [o.moved(config.width, config.height) for o in objects]


def expected_counts(
    truth: Iterable[VideoFrameTruth],
) -> tuple[dict[tuple[str, str, str], int], dict[tuple[str, str], int]]:
    """Crossings of "gate" and entries into "pen" by box centres, frame to frame (a centre
    exactly on the line is on neither side: the crossing is counted when it is past it)."""
    crossings: Counter[tuple[str, str, str]] = Counter()
    entered: dict[int, str] = {}
    last_side: dict[int, int] = {}  # -1: x < the line, +1: x > the line; on it: not updated
    for frame in truth:
        for a in frame.annotations:
            assert a.track_id is not None
            x1, y1, x2, y2 = a.xyxy
            cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
            side = (cx > LINE_X) - (cx < LINE_X)
            before = last_side.get(a.track_id)
            if side and before and side != before and LINE_Y[0] <= cy <= LINE_Y[1]:
                crossings["gate", a.class_name, "in" if side < 0 else "out"] += 1
            if side:
                last_side[a.track_id] = side
            if ZONE_X[0] <= cx <= ZONE_X[1] and ZONE_Y[0] <= cy <= ZONE_Y[1]:
                entered.setdefault(a.track_id, a.class_name)
    entries = Counter(("pen", name) for name in entered.values())
    return dict(crossings), dict(entries)
