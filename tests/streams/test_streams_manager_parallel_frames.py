"""A stream with `parallel_frames` > 1: the next frame is detected while the last one still
is, and results are still published in frame order. Stand-in detector (DetectorLike) whose
calls take uneven times, on real video."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import numpy as np
import pytest
from support.truth import SAMPLE
from support.waiting import wait_until

from vdet.config.streams import StreamSpec
from vdet.core.types import Detections, ImageArray, StageTimings
from vdet.inference.postprocess import PostprocessParams
from vdet.metrics.registry import Metrics
from vdet.results.hub import ResultsHub
from vdet.streams.manager import StreamManager


def _nothing_found(count: int) -> list[tuple[Detections, StageTimings]]:
    empty = Detections(np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int64))
    return [(empty, StageTimings(inference=0.001)) for _ in range(count)]


class _UnevenDetector:
    """Finds nothing; every other call takes longer, so a later frame can finish first. Counts
    the calls that ran at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running = 0
        self.most_at_once = 0
        self._calls = 0

    def detect(
        self, images: Sequence[ImageArray], params: PostprocessParams | None = None
    ) -> list[tuple[Detections, StageTimings]]:
        with self._lock:
            self._calls += 1
            slow = self._calls % 2 == 1
            self._running += 1
            self.most_at_once = max(self.most_at_once, self._running)
        time.sleep(0.03 if slow else 0.005)
        with self._lock:
            self._running -= 1
        return _nothing_found(len(images))


def test_frames_in_detection_at_once_publish_in_frame_order() -> None:
    hub = ResultsHub(capacity_per_source=4096, capacity_total=8192)
    detector = _UnevenDetector()
    manager = StreamManager(detector, ("a", "b"), hub, Metrics(), max_streams=2, parallel_frames=2)
    try:
        manager.add(StreamSpec(id="cam", url=str(SAMPLE), realtime=False, loop=True))
        wait_until(lambda: manager.get("cam").frames_processed >= 30, 120, what="30 results")
        results = hub.since(0, "cam")
        assert [r.frame_index for r in results] == sorted(r.frame_index for r in results)
        assert detector.most_at_once == 2
    finally:
        manager.close()


def test_parallel_frames_must_be_positive() -> None:
    hub = ResultsHub(capacity_per_source=16, capacity_total=16)
    with pytest.raises(ValueError, match="parallel_frames"):
        StreamManager(_UnevenDetector(), ("a",), hub, Metrics(), max_streams=1, parallel_frames=0)


class _GatedDetector:
    """Finds nothing; every call waits until the test opens the gate."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self._lock = threading.Lock()
        self.started = 0

    def detect(
        self, images: Sequence[ImageArray], params: PostprocessParams | None = None
    ) -> list[tuple[Detections, StageTimings]]:
        with self._lock:
            self.started += 1
        self.gate.wait(30)
        return _nothing_found(len(images))


def test_one_more_host_frame_is_taken_to_start_when_a_detection_ends() -> None:
    # Both detections busy: the next frame is taken from the mailbox anyway (so a frame that
    # arrives after it does not overwrite it there), and it is the only one.
    hub = ResultsHub(capacity_per_source=4096, capacity_total=8192)
    detector = _GatedDetector()
    manager = StreamManager(detector, ("a", "b"), hub, Metrics(), max_streams=1, parallel_frames=2)
    try:
        manager.add(StreamSpec(id="cam", url=str(SAMPLE), realtime=False, loop=True))
        mailbox = manager._stream("cam").mailbox
        wait_until(lambda: detector.started == 2 and mailbox.pending, 60, what="two running")
        time.sleep(0.3)
        assert (detector.started, mailbox.delivered) == (2, 3)
        detector.gate.set()
        wait_until(lambda: manager.get("cam").frames_processed >= 10, 60, what="10 results")
        results = hub.since(0, "cam")
        assert [r.frame_index for r in results] == sorted(r.frame_index for r in results)
    finally:
        detector.gate.set()
        manager.close()
