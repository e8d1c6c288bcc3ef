"""Results as the results hub gets them from a stream, with zone events, for the tests of what
reads the hub (webhooks, MQTT)."""

from __future__ import annotations

import time

import numpy as np

from vdet.core.types import DetectionResult, Detections, StageTimings, ZoneEvent

NAMES = ("person", "car", "dog")


def result(source: str = "gate", *events: ZoneEvent, frame: int = 7) -> DetectionResult:
    return DetectionResult(
        source_id=source,
        frame_index=frame,
        pts_seconds=frame / 30,
        arrival_time=time.time(),
        published_time=time.time(),
        image_size_wh=(1920, 1080),
        detections=Detections(
            np.array([[10, 20, 30, 40]], np.float32),
            np.array([0.9], np.float32),
            np.array([0], np.int64),
        ),
        timings=StageTimings(0.001, 0.001, 0.01, 0.001, 0.02),
        events=events,
    )
