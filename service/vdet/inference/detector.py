"""The detector: letterbox -> backend -> decode + NMS -> boxes in source pixels.

This module owns the one entry point that the service, `vdet detect`, `vdet eval` and the
benchmarks call, and the stage timings it reports. It composes the stages; it must not
reimplement any of them, and it knows nothing about video sources, queues or the API.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Literal

import numpy as np

from vdet.core.model import ModelInfo
from vdet.core.types import Detections, ImageArray, StageTimings
from vdet.inference.backends import create_backend
from vdet.inference.backends.base import InferenceBackend
from vdet.inference.postprocess import PostprocessParams, decode_and_nms_image
from vdet.inference.preprocess import LetterboxTransform, letterbox, rect_input_hw

# How a frame is letterboxed: into the smallest input that holds it, or the model's square.
InputShape = Literal["rect", "square"]


class Detector:
    """Owns one backend and runs whole batches of BGR frames through the pipeline.

    Thread-safe when the backend is (every backend's `infer` must be): `detect` keeps no state
    between calls. Per-frame timings: `preprocess` and `postprocess` are that frame's own time;
    `inference` is the whole batch's call, since every frame in the batch waited for all of it
    (divide by the batch size for throughput).
    """

    def __init__(
        self,
        backend: InferenceBackend,
        params: PostprocessParams | None = None,
        input_shape: InputShape = "rect",
    ) -> None:
        self.backend = backend
        self.params = PostprocessParams() if params is None else params
        # "rect": each frame letterboxed into the smallest stride-multiple input that holds it,
        # where the backend takes such inputs (else, and with "square", the model's input size).
        self.input_shape: InputShape = input_shape

    @classmethod
    def open(
        cls,
        model_path: str | os.PathLike[str],
        backend: str = "auto",
        params: PostprocessParams | None = None,
        input_shape: InputShape = "rect",
        **backend_options: Any,
    ) -> Detector:
        """Build the backend with `create_backend(backend, model_path, **backend_options)`."""
        return cls(create_backend(backend, model_path, **backend_options), params, input_shape)

    def input_hw(self, source_wh: tuple[int, int]) -> tuple[int, int]:
        """The network input a frame of `source_wh` is letterboxed into."""
        info = self.info
        if self.input_shape == "square" or not self.backend.rect_inputs:
            return info.input_hw
        return rect_input_hw(source_wh, info.input_hw, info.stride)

    @property
    def info(self) -> ModelInfo:
        return self.backend.info

    @property
    def parallel_frames(self) -> int:
        """How many frames a caller should keep in `detect` at once for the most frames per
        second: the backend's `parallel_calls`."""
        return self.backend.parallel_calls

    def detect(
        self, images_bgr: Sequence[ImageArray], params: PostprocessParams | None = None
    ) -> list[tuple[Detections, StageTimings]]:
        """Detect objects in HxWx3 uint8 BGR frames of any sizes; boxes in each frame's pixels.

        `params` overrides the detector's default thresholds for this call. An empty list
        returns an empty list without touching the backend.
        """
        params = self.params if params is None else params
        # Frames of one input shape share a batch (cameras of one resolution: one batch).
        groups: dict[tuple[int, int], list[int]] = {}
        for i, image in enumerate(images_bgr):
            groups.setdefault(self.input_hw((image.shape[1], image.shape[0])), []).append(i)
        results: dict[int, tuple[Detections, StageTimings]] = {}
        for input_hw, members in groups.items():
            batch = self._detect_batch([images_bgr[i] for i in members], input_hw, params)
            results.update(zip(members, batch, strict=True))
        return [results[i] for i in range(len(images_bgr))]

    def _detect_batch(
        self, images_bgr: Sequence[ImageArray], input_hw: tuple[int, int], params: PostprocessParams
    ) -> list[tuple[Detections, StageTimings]]:
        H, W = input_hw
        batch = np.empty((len(images_bgr), 3, H, W), np.float32)
        transforms: list[LetterboxTransform] = []
        preprocess_seconds: list[float] = []
        for i, image in enumerate(images_bgr):
            start = time.perf_counter()
            transforms.append(letterbox(image, (H, W), out=batch[i])[1])
            preprocess_seconds.append(time.perf_counter() - start)

        start = time.perf_counter()
        raw = self.backend.infer(batch)
        inference_seconds = time.perf_counter() - start
        if raw.shape[0] != len(images_bgr):
            raise RuntimeError(
                f"{self.backend!r} returned {raw.shape[0]} results for {len(images_bgr)} images"
            )

        results = []
        for head, transform, pre_seconds in zip(raw, transforms, preprocess_seconds, strict=True):
            start = time.perf_counter()
            dets = decode_and_nms_image(head, params)[0]
            dets = Detections(transform.to_source(dets.xyxy), dets.scores, dets.class_ids)
            timings = StageTimings(
                preprocess=pre_seconds,
                inference=inference_seconds,
                postprocess=time.perf_counter() - start,
            )
            results.append((dets, timings))
        return results

    def close(self) -> None:
        self.backend.close()

    def __enter__(self) -> Detector:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
