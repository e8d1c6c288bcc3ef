"""Writing synthetic scenes to disk: YOLO + COCO datasets, H.264 clips with per-frame truth.

Rendering lives in `vdet.modelkit.dataset.synthetic`; this module only serialises. The COCO file is
what `vdet eval` scores against; the YOLO layout is what Ultralytics trains on; both describe the
same images with the same boxes (COCO bbox = [x1, y1, w, h] in pixel edges).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from fractions import Fraction
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from vdet.core.types import ImageArray
from vdet.modelkit.dataset.synthetic import (
    CLASS_NAMES,
    Annotation,
    SceneConfig,
    VideoFrameTruth,
    render_image,
    render_video,
)


def _write_one(args: tuple[Path, str, int, SceneConfig, int]) -> dict[str, object]:
    root, split, seed, config, quality = args
    scene = render_image(seed, config)
    name = f"{split}_{seed:07d}"
    cv2.imwrite(
        str(root / "images" / split / f"{name}.jpg"),
        scene.image_bgr,
        [cv2.IMWRITE_JPEG_QUALITY, quality],
    )
    h, w = scene.image_bgr.shape[:2]
    lines = []
    for a in scene.annotations:
        x1, y1, x2, y2 = a.xyxy
        lines.append(
            f"{a.class_id} {(x1 + x2) / 2 / w:.6f} {(y1 + y2) / 2 / h:.6f} "
            f"{(x2 - x1) / w:.6f} {(y2 - y1) / h:.6f}"
        )
    (root / "labels" / split / f"{name}.txt").write_text("\n".join(lines) + ("\n" if lines else ""))
    return {
        "file_name": f"images/{split}/{name}.jpg",
        "width": w,
        "height": h,
        "seed": seed,
        "annotations": [asdict(a) for a in scene.annotations],
    }


def write_dataset(
    root: Path,
    splits: dict[str, Sequence[int]],
    config: SceneConfig | None = None,
    jpeg_quality: int = 95,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Path]:
    """Render `splits` (name -> seeds) under `root`; returns each split's COCO JSON path.
    `progress(done, total)` is told after each image, over all splits.

    Also writes `root/data.yaml` for Ultralytics. Deterministic: the same seeds give the same
    files byte for byte (JPEG encoding included), whatever the number of workers.
    """
    config = config or SceneConfig()
    root.mkdir(parents=True, exist_ok=True)
    coco_paths: dict[str, Path] = {}
    workers = workers or min(8, os.cpu_count() or 1)
    total = sum(len(seeds) for seeds in splits.values())
    done = 0

    def counted(items: Iterable[dict[str, object]]) -> list[dict[str, object]]:
        nonlocal done
        out: list[dict[str, object]] = []
        for item in items:
            out.append(item)
            done += 1
            if progress is not None:
                progress(done, total)
        return out

    for split, seeds in splits.items():
        (root / "images" / split).mkdir(parents=True, exist_ok=True)
        (root / "labels" / split).mkdir(parents=True, exist_ok=True)
        jobs = [(root, split, int(s), config, jpeg_quality) for s in seeds]
        if workers > 1 and len(jobs) > 1:
            with ProcessPoolExecutor(workers) as pool:
                records = counted(pool.map(_write_one, jobs, chunksize=8))
        else:
            records = counted(_write_one(j) for j in jobs)
        coco_paths[split] = root / f"{split}_coco.json"
        coco_paths[split].write_text(json.dumps(_coco(records)))
    names = "\n".join(f"  {i}: {n}" for i, n in enumerate(CLASS_NAMES))
    train = "images/train" if "train" in splits else next(iter(splits))
    val = "images/val" if "val" in splits else train
    (root / "data.yaml").write_text(
        f"path: {root.resolve()}\ntrain: {train}\nval: {val}\nnames:\n{names}\n"
    )
    return coco_paths


def _coco(records: Iterable[dict[str, object]]) -> dict[str, object]:
    images: list[dict[str, object]] = []
    annotations: list[dict[str, object]] = []
    for image_id, rec in enumerate(records, start=1):
        images.append(
            {
                "id": image_id,
                "file_name": rec["file_name"],
                "width": rec["width"],
                "height": rec["height"],
            }
        )
        anns = rec["annotations"]
        assert isinstance(anns, list)
        for a in anns:
            x1, y1, x2, y2 = a["xyxy"]
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": a["class_id"],
                    "bbox": [x1, y1, x2 - x1, y2 - y1],
                    "area": (x2 - x1) * (y2 - y1),
                    "iscrowd": 0,
                    "visible_fraction": a["visible_fraction"],
                }
            )
    return {
        "images": images,
        "annotations": annotations,
        "categories": [{"id": i, "name": n} for i, n in enumerate(CLASS_NAMES)],
    }


class ClipWriter:
    """Encode BGR frames one at a time to H.264 (yuv420p, BT.709 tagged) in MP4/MKV.

    `b_frames=0` makes an IPPP stream that a decoder can output with one frame of latency; a
    keyframe every `gop` frames lets an RTSP client join within a second. The frame size is
    taken from the first frame written.
    """

    def __init__(
        self,
        path: Path,
        fps: float = 30,
        crf: int = 26,
        gop: int = 30,
        b_frames: int = 0,
        preset: str = "medium",
        codec: str = "libx264",
    ) -> None:
        import av  # only clip writing needs FFmpeg

        path.parent.mkdir(parents=True, exist_ok=True)
        self._av = av
        self._container = av.open(str(path), mode="w")
        stream = self._container.add_stream(codec, rate=Fraction(fps).limit_denominator(1001))
        assert isinstance(stream, av.VideoStream)
        self._stream = stream
        self._options: dict[str, object] = {
            "crf": str(crf),
            "preset": preset,
            "bf": str(b_frames),
            "x264-params": f"keyint={gop}:min-keyint={gop}:scenecut=0",
        }
        self._gop, self._b_frames, self._codec = gop, b_frames, codec
        self._started = False

    def _start(self, w: int, h: int) -> None:
        stream = self._stream
        stream.width, stream.height = w, h
        stream.pix_fmt = "yuv420p"
        stream.codec_context.gop_size = self._gop
        stream.codec_context.max_b_frames = self._b_frames
        stream.codec_context.color_primaries = 1  # BT.709
        stream.codec_context.color_trc = 1
        stream.codec_context.colorspace = 1
        stream.codec_context.color_range = 1  # limited ("tv") range
        if self._codec.startswith("libx264"):
            stream.options = self._options
        self._started = True

    def write(self, image_bgr: ImageArray) -> None:
        if not self._started:
            self._start(image_bgr.shape[1], image_bgr.shape[0])
        frame = self._av.VideoFrame.from_ndarray(np.ascontiguousarray(image_bgr), format="bgr24")
        for packet in self._stream.encode(frame):
            self._container.mux(packet)

    def close(self) -> None:
        if self._started:
            for packet in self._stream.encode():
                self._container.mux(packet)
        self._container.close()

    def __enter__(self) -> ClipWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_clip(path: Path, frames: Sequence[ImageArray], fps: int = 30, **encode: Any) -> None:
    """Encode a list of BGR frames; `encode` as for `ClipWriter`."""
    with ClipWriter(path, fps=fps, **encode) as writer:
        for image in frames:
            writer.write(image)


def truth_to_json(
    truth: Sequence[VideoFrameTruth], fps: int, width: int, height: int
) -> dict[str, object]:
    return {
        "fps": fps,
        "width": width,
        "height": height,
        "classes": list(CLASS_NAMES),
        "box_format": "xyxy pixel edges (x2 = last column + 1), amodal",
        "frames": [
            {
                "index": t.index,
                "pts": round(t.pts_seconds, 6),
                "objects": [_annotation_json(a) for a in t.annotations],
            }
            for t in truth
        ],
    }


def _annotation_json(a: Annotation) -> dict[str, object]:
    out: dict[str, object] = {
        "class_id": a.class_id,
        "class": a.class_name,
        "box": list(a.xyxy),
        "visible_fraction": a.visible_fraction,
    }
    if a.track_id is not None:
        out["track_id"] = a.track_id
    return out


def write_video_with_truth(
    clip_path: Path,
    seed: int,
    seconds: float = 10.0,
    fps: int = 30,
    config: SceneConfig | None = None,
    **encode: Any,
) -> Path:
    """Render and encode one clip; its truth goes beside it as `<clip>.json`."""
    config = config or SceneConfig()
    frames, truth = render_video(seed, round(seconds * fps), fps=fps, config=config)
    write_clip(clip_path, frames, fps=fps, **encode)
    truth_path = clip_path.with_suffix(".json")
    truth_path.write_text(json.dumps(truth_to_json(truth, fps, config.width, config.height)))
    return truth_path


def write_counting_clip(clip_path: Path, seed: int, seconds: float = 6.0, fps: int = 30) -> Path:
    """Render and encode a counting clip (vdet.modelkit.dataset.counting); beside it, `<clip>.json`
    holds its per-frame truth, its zones (ready for `StreamSpec.zones`) and the expected
    crossings and entries."""
    from vdet.modelkit.dataset.counting import counting_zones, expected_counts, iter_counting_video

    truth: list[VideoFrameTruth] = []
    with ClipWriter(clip_path, fps=fps) as writer:
        for image, frame_truth in iter_counting_video(seed, round(seconds * fps), fps=fps):
            writer.write(image)
            truth.append(frame_truth)
    crossings, entries = expected_counts(truth)
    config = SceneConfig()
    record = truth_to_json(truth, fps, config.width, config.height)
    record["zones"] = counting_zones()
    record["expected"] = {
        "line_cross": [
            {"zone": z, "class": c, "direction": d, "count": n}
            for (z, c, d), n in sorted(crossings.items())
        ],
        "zone_enter": [
            {"zone": z, "class": c, "count": n} for (z, c), n in sorted(entries.items())
        ],
    }
    truth_path = clip_path.with_suffix(".json")
    truth_path.write_text(json.dumps(record))
    return truth_path
