"""`vdet bench pipeline --baseline ultralytics`: vdet against Ultralytics' `predict` on one clip.

The comparison the CPU speed targets are stated in: the same ONNX model file, the same clip,
both end to end from the file to boxes in source pixels. vdet runs as the service runs a
stream (`SourceReader` decoding with PyAV, then `Detector.detect`); Ultralytics runs its own
default streaming `predict` (its OpenCV video loader, its rectangular letterbox, its ONNX Runtime
backend, its torch NMS). Both use ONNX Runtime's CPU provider with its default thread count (one
per core): Ultralytics gives no way to set it, so vdet leaves its own at the default too.

On a shared machine two runs one after the other see different loads, so the two pipelines
alternate in blocks of frames within one run, each keeping its decoder and session between
blocks; the ratio is taken over the same stretch of time. Each frame's boxes are matched between
the two (same class, IoU >= `MATCH_IOU`), so a speed-up that changed what is found shows.

This module owns that loop and the matching; it must not change either pipeline. Ultralytics is
AGPL-3.0 and only in the `train` extra: it is imported here, on demand, never by the service.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from vdet.bench import environment, summarize_ms
from vdet.contract import CONF_THRESHOLD, IOU_THRESHOLD, MAX_DET
from vdet.ingest.reader import DecodeError, SourceReader
from vdet.pipeline.detector import Detector
from vdet.types import Detections, FloatArray

# Two detections of one object: same class and at least this IoU.
MATCH_IOU = 0.5


def match_count(
    xyxy_a: FloatArray,
    classes_a: np.ndarray[Any, Any],
    xyxy_b: FloatArray,
    classes_b: np.ndarray[Any, Any],
    iou_threshold: float = MATCH_IOU,
) -> int:
    """How many boxes of a find a partner in b (same class, IoU >= threshold), one-to-one,
    greedily in a's order; boxes are (n, 4) xyxy."""
    a = np.asarray(xyxy_a, np.float64).reshape(-1, 4)
    b = np.asarray(xyxy_b, np.float64).reshape(-1, 4)
    if len(a) == 0 or len(b) == 0:
        return 0
    top_left = np.maximum(a[:, None, :2], b[None, :, :2])
    bottom_right = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(bottom_right - top_left, 0, None), axis=2)
    area_a = np.prod(a[:, 2:] - a[:, :2], axis=1)
    area_b = np.prod(b[:, 2:] - b[:, :2], axis=1)
    union = area_a[:, None] + area_b[None, :] - inter
    iou = np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)
    iou[np.asarray(classes_a).reshape(-1, 1) != np.asarray(classes_b).reshape(1, -1)] = 0.0
    taken = np.zeros(len(b), np.bool_)
    matched = 0
    for row in iou:
        candidates = np.where(taken, -1.0, row)
        j = int(np.argmax(candidates))
        if candidates[j] >= iou_threshold:
            taken[j] = True
            matched += 1
    return matched


def _vdet_frames(detector: Detector, reader: SourceReader) -> Iterator[Detections]:
    """vdet's stream path: each decoded frame detected as it comes (batch 1)."""
    reader.open()
    for item in reader.frames():
        if isinstance(item, DecodeError):
            continue
        ((detections, _),) = detector.detect([item.image_bgr])
        yield detections


def _ultralytics_frames(model: Any, source: str) -> Iterator[Detections]:
    """Ultralytics' default streaming `predict` from the file, as `Detections`.

    Its defaults except the thresholds, which are vdet's so that both should find the same
    boxes (Ultralytics' own default IoU is 0.7; NMS costs about the same at either)."""
    results = model.predict(
        source,
        stream=True,
        verbose=False,
        conf=CONF_THRESHOLD,
        iou=IOU_THRESHOLD,
        max_det=MAX_DET,
        device="cpu",
    )
    for result in results:
        boxes = result.boxes
        yield Detections(
            boxes.xyxy.numpy().astype(np.float32),
            boxes.conf.numpy().astype(np.float32),
            boxes.cls.numpy().astype(np.int32),
        )


def run_pipeline_vs_ultralytics(
    model: str | os.PathLike[str],
    source: str,
    frames: int = 150,
    warmup: int = 10,
    block: int = 10,
) -> dict[str, object]:
    """Frames per second of vdet and of Ultralytics' `predict` on `source`, alternating in
    blocks of `block` frames (the first `warmup` frames of each uncounted), and how many of each
    other's boxes they found. Both read the file once through (no looping), so `frames +
    warmup` beyond the clip's length ends the run early; `frames` reports what was counted."""
    if frames < 1 or warmup < 0 or block < 1:
        raise ValueError(
            f"frames and block must be >= 1, warmup >= 0; got {frames}, {warmup}, {block}"
        )
    # Ultralytics must not reach the network (settings sync, asset downloads).
    os.environ.setdefault("YOLO_OFFLINE", "1")
    try:
        import cv2
        import torch
        from ultralytics import YOLO  # type: ignore[attr-defined]
    except ImportError as exc:
        raise RuntimeError(
            "the Ultralytics baseline needs the train extra: pip install 'vdet[train]'"
        ) from exc

    names = ("vdet", "ultralytics")
    seconds: dict[str, list[float]] = {name: [] for name in names}
    found: dict[str, list[Detections]] = {name: [] for name in names}
    with (
        Detector.open(model, "onnxruntime", input_shape="rect") as detector,
        SourceReader(source) as reader,
    ):
        streams = {
            "vdet": _vdet_frames(detector, reader),
            "ultralytics": _ultralytics_frames(YOLO(str(model), task="detect"), source),
        }
        ended = False
        block_index = 0
        while not ended and min(len(found[n]) for n in names) < warmup + frames:
            order = names if block_index % 2 == 0 else names[::-1]
            block_index += 1
            for name in order:
                for _ in range(block):
                    if len(found[name]) >= warmup + frames:
                        break
                    started = time.perf_counter()
                    detections = next(streams[name], None)
                    elapsed = time.perf_counter() - started
                    if detections is None:
                        ended = True
                        break
                    found[name].append(detections)
                    if len(found[name]) > warmup:
                        seconds[name].append(elapsed)
        for stream in streams.values():
            stream.close()  # type: ignore[attr-defined]
        vdet_device = detector.backend.device
        input_hw = (
            detector.input_hw((reader.info.width, reader.info.height)) if reader.info else None
        )

    counted = min(len(seconds[n]) for n in names)
    fps = {n: round(counted / sum(seconds[n][:counted]), 2) if counted else 0.0 for n in names}
    pairs = list(zip(found["vdet"], found["ultralytics"], strict=False))
    vdet_boxes = sum(len(v) for v, _ in pairs)
    ultralytics_boxes = sum(len(u) for _, u in pairs)
    matched = sum(match_count(v.xyxy, v.class_ids, u.xyxy, u.class_ids) for v, u in pairs)
    return {
        "scenario": "pipeline_vs_ultralytics",
        "environment": {
            **environment(),
            "ultralytics": _version("ultralytics"),
        },
        "model": Path(model).name,
        "source": Path(source).name,
        "frames": counted,
        "warmup_frames": warmup,
        "block_frames": block,
        "input_hw_used": list(input_hw) if input_hw else None,
        "threads": {
            "onnxruntime_intra_op": "default (one per core) in both",
            "vdet_backend": vdet_device,
            "torch": torch.get_num_threads(),
            "opencv": cv2.getNumThreads(),
        },
        "latency_ms": {n: summarize_ms(seconds[n][:counted]) for n in names},
        "frames_per_s": fps,
        "vdet_over_ultralytics_fps": (
            round(fps["vdet"] / fps["ultralytics"], 3) if fps["ultralytics"] else None
        ),
        "boxes": {
            "frames_compared": len(pairs),
            "vdet": vdet_boxes,
            "ultralytics": ultralytics_boxes,
            "matched": matched,
            "match_iou": MATCH_IOU,
            # recall of each against the other
            "ultralytics_found_by_vdet": round(matched / ultralytics_boxes, 4)
            if ultralytics_boxes
            else None,
            "vdet_found_by_ultralytics": round(matched / vdet_boxes, 4) if vdet_boxes else None,
        },
    }


def _version(package: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None
