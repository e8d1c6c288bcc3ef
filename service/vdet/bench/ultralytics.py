"""`vdet bench pipeline --baseline ultralytics`: vdet against Ultralytics' `predict` on one clip.

The comparison the CPU speed targets are stated in: the same ONNX model file, the same clip,
both end to end from the file to boxes in source pixels, both on ONNX Runtime's CPU provider
with the cores of the machine. vdet runs as `vdet serve` runs a stream on the CPU (`_VdetStream`:
`SourceReader` decoding with PyAV in a thread of its own, `Detector.detect` with the detector
`vdet serve` opens, two ONNX Runtime sessions of cores / 2 threads each, two frames in
detection at once); Ultralytics runs its own default streaming `predict` (its OpenCV video
loader, its rectangular letterbox, one ONNX Runtime session with ONNX Runtime's default threads,
one per core, which Ultralytics gives no way to change, one frame at a time, its torch NMS).

The same run also measures vdet one frame at a time on one session with ONNX Runtime's default
threads (`vdet_one_frame`: the stream path before it kept two frames in detection), so the step
from that to today has its own same-run ratio. On a shared machine two runs one after the other
see different loads, so the pipelines take turns in blocks of frames within one run, each
keeping its decoder and sessions between blocks; the ratios are taken over the same stretch of
time. Each frame's boxes are matched between vdet and Ultralytics (same class, IoU >=
`MATCH_IOU`), so a speed-up that changed what is found shows.

This module owns that loop and the matching; it must not change either pipeline. Ultralytics is
AGPL-3.0 and only in the `train` extra: it is imported here, on demand, never by the service.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from vdet.bench.environment import environment
from vdet.bench.stats import summarize_ms
from vdet.config.settings import Settings
from vdet.core.contract import CONF_THRESHOLD, IOU_THRESHOLD, MAX_DET
from vdet.core.extras import needs_extra
from vdet.core.types import Detections, FloatArray, ImageArray
from vdet.inference.detector import Detector
from vdet.inference.factory import cpu_sessions
from vdet.ingest.reader import DecodeError, SourceReader, StreamInfo

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


class _VdetStream:
    """vdet's stream path as `vdet serve` runs it on the CPU: a decoding thread ahead of
    detection (serve's ingest worker), and `parallel_frames` frames in detection at once
    (serve's pipeline thread and its detection pool), results in frame order.

    Unlike serve's latest-frame mailbox it drops no frame (a bounded queue), so every frame is
    detected, as Ultralytics does. `block(n)` runs n frames to the end and leaves nothing in
    detection, and decoding only runs while a block does (at most the one frame it was on
    finishes after), so the work of one pipeline does not spill into the other's block.
    """

    def __init__(self, detector: Detector, source: str) -> None:
        self._detector = detector
        # One thread opens, reads and closes the reader, as SourceReader asks: the decoder.
        self._reader = SourceReader(source)
        self._opened = threading.Event()
        self._open_error: BaseException | None = None
        self._info: StreamInfo | None = None
        self._depth = detector.parallel_frames
        self._frames: queue.Queue[ImageArray | None] = queue.Queue(maxsize=self._depth + 1)
        self._running = threading.Event()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(self._depth, thread_name_prefix="bench-detect")
        self._decoder = threading.Thread(target=self._decode, name="bench-decode", daemon=True)
        self._decoder.start()
        self._opened.wait()
        if self._open_error is not None:
            self.close()
            raise self._open_error

    @property
    def info(self) -> StreamInfo:
        if self._info is None:
            raise RuntimeError("the source is not open")
        return self._info

    def _decode(self) -> None:
        try:
            try:
                self._info = self._reader.open()
            except BaseException as exc:
                self._open_error = exc
                return
            finally:
                self._opened.set()
            for item in self._reader.frames():
                if isinstance(item, DecodeError):
                    continue
                while not (self._stop.is_set() or self._running.wait(0.1)):
                    pass
                while not self._stop.is_set():
                    try:
                        self._frames.put(item.image_bgr, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if self._stop.is_set():
                    return
        finally:
            self._reader.close()
            with contextlib.suppress(queue.Full):
                self._frames.put(None, timeout=1.0)

    def _detect(self, image: ImageArray) -> Detections:
        ((detections, _),) = self._detector.detect([image])
        return detections

    def block(self, n: int) -> list[Detections]:
        """The next n frames' detections (fewer at the end of the clip)."""
        self._running.set()
        done: list[Detections] = []
        in_flight: collections.deque[Future[Detections]] = collections.deque()
        ended = False
        try:
            while len(done) + len(in_flight) < n or in_flight:
                if not ended and len(in_flight) < self._depth and len(done) + len(in_flight) < n:
                    image = self._frames.get()
                    if image is None:
                        ended = True
                    else:
                        in_flight.append(self._pool.submit(self._detect, image))
                    continue
                if not in_flight:
                    break
                done.append(in_flight.popleft().result())
        finally:
            self._running.clear()
        return done

    def close(self) -> None:
        self._stop.set()
        self._running.set()
        self._pool.shutdown(wait=True)
        self._decoder.join(timeout=10.0)


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
        from ultralytics.utils import LOGGER
    except ImportError as exc:
        raise RuntimeError(needs_extra("the Ultralytics baseline", "train")) from exc
    # Ultralytics logs to stdout, where `vdet bench` prints the result's JSON.
    for handler in LOGGER.handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream is sys.stdout:
            handler.setStream(sys.stderr)

    # "vdet_one_frame": one session with the default threads, one frame at a time: vdet's
    # stream path before it kept two frames in detection, the step this run also measures.
    names = ("vdet", "ultralytics", "vdet_one_frame")
    seconds: dict[str, list[float]] = {name: [] for name in names}
    found: dict[str, list[Detections]] = {name: [] for name in names}
    # As `vdet serve` opens it on this CPU (vdet.root.open_configured_detector).
    sessions = cpu_sessions(Settings())
    with (
        Detector.open(model, "onnxruntime", input_shape="rect", sessions=sessions) as detector,
        Detector.open(model, "onnxruntime", input_shape="rect") as one_frame,
    ):
        vdet = {
            "vdet": _VdetStream(detector, source),
            "vdet_one_frame": _VdetStream(one_frame, source),
        }
        ultralytics = _ultralytics_frames(YOLO(str(model), task="detect"), source)
        try:
            ended = False
            block_index = 0
            while not ended and min(len(found[n]) for n in names) < warmup + frames:
                # each goes first, second and last in turn
                shift = block_index % len(names)
                order = names[shift:] + names[:shift]
                block_index += 1
                for name in order:
                    # Warm-up frames run in blocks of their own, never timed with counted ones.
                    todo = min(block, warmup + frames - len(found[name]))
                    if len(found[name]) < warmup:
                        todo = min(todo, warmup - len(found[name]))
                    if todo <= 0:
                        continue
                    started = time.perf_counter()
                    if name in vdet:
                        got = vdet[name].block(todo)
                    else:
                        got = list(itertools.islice(ultralytics, todo))
                    elapsed = time.perf_counter() - started
                    timed = len(found[name]) >= warmup
                    found[name].extend(got)
                    if timed and got:
                        seconds[name].extend([elapsed / len(got)] * len(got))
                    ended = ended or len(got) < todo
        finally:
            for stream in vdet.values():
                stream.close()
            ultralytics.close()  # type: ignore[attr-defined]
        devices = {"vdet": detector.backend.device, "vdet_one_frame": one_frame.backend.device}
        info = vdet["vdet"].info
        input_hw = detector.input_hw((info.width, info.height))

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
        "input_hw_used": list(input_hw),
        "threads": {
            **devices,
            "ultralytics": "onnxruntime default intra-op threads (one per core), one session",
            "torch": torch.get_num_threads(),
            "opencv": cv2.getNumThreads(),
        },
        # each frame's share of its block's time (blocks of `block_frames`)
        "ms_per_frame": {n: summarize_ms(seconds[n][:counted]) for n in names},
        "frames_per_s": fps,
        "vdet_over_ultralytics_fps": (
            round(fps["vdet"] / fps["ultralytics"], 3) if fps["ultralytics"] else None
        ),
        "vdet_one_frame_over_ultralytics_fps": (
            round(fps["vdet_one_frame"] / fps["ultralytics"], 3) if fps["ultralytics"] else None
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
