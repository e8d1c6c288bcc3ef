"""An unpaced file (`realtime: false`) decodes up to the manager's `unpaced_queue_frames` frames
ahead of
detection and still hands every frame on, in order. Stand-in detector (DetectorLike) that holds
its first call until released, on real video."""

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


class _HeldDetector:
    """Finds nothing; every call waits for `release`."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = 0

    def detect(
        self, images: Sequence[ImageArray], params: PostprocessParams | None = None
    ) -> list[tuple[Detections, StageTimings]]:
        self.started += 1
        self.release.wait(30)
        empty = Detections(
            np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int64)
        )
        return [(empty, StageTimings(inference=0.001)) for _ in images]


@pytest.mark.parametrize("queued", [1, 3])
def test_decoding_runs_that_many_frames_ahead_then_every_frame_is_detected_in_order(
    queued: int,
) -> None:
    hub = ResultsHub(capacity_per_source=4096, capacity_total=8192)
    detector = _HeldDetector()
    manager = StreamManager(
        detector, ("a", "b"), hub, Metrics(), max_streams=1, unpaced_queue_frames=queued
    )
    try:
        manager.add(StreamSpec(id="cam", url=str(SAMPLE), realtime=False))
        mailbox = manager._stream("cam").mailbox
        # frame 0 in detection, the next `queued` waiting in the mailbox, none dropped
        wait_until(lambda: mailbox.put_count == 1 + queued, 30, what="the queue filled")
        time.sleep(0.3)
        assert (detector.started, mailbox.delivered, mailbox.put_count) == (1, 1, 1 + queued)
        assert mailbox.dropped == 0
        detector.release.set()
        wait_until(lambda: manager.get("cam").frames_processed >= 40, 60, what="40 results")
        assert [r.frame_index for r in hub.since(0, "cam")][:40] == list(range(40))
        assert mailbox.dropped == 0
    finally:
        detector.release.set()
        manager.close()
