"""The stream manager's publisher thread: per-stream order, nothing after removal, and one
failing result does not stop publishing. Stand-in detector (DetectorLike) on real video."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

import numpy as np
import pytest
from support.truth import SAMPLE
from support.waiting import wait_until

from vdet.config.streams import StreamSpec
from vdet.core.types import DetectionResult, Detections, ImageArray, StageTimings
from vdet.inference.postprocess import PostprocessParams
from vdet.metrics.registry import Metrics
from vdet.results.hub import ResultsHub
from vdet.streams.manager import StreamManager


class _NoBoxes:
    """A detector that finds nothing, quickly: the test is about what happens after it."""

    def detect(
        self, images: Sequence[ImageArray], params: PostprocessParams
    ) -> list[tuple[Detections, StageTimings]]:
        empty = Detections(
            np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int64)
        )
        return [(empty, StageTimings(inference=0.001)) for _ in images]


def _manager(hub: ResultsHub) -> StreamManager:
    return StreamManager(_NoBoxes(), ("a", "b"), hub, Metrics(), max_streams=4)


def test_each_stream_publishes_in_frame_order_and_nothing_after_removal() -> None:
    hub = ResultsHub(capacity_per_source=4096, capacity_total=8192)
    manager = _manager(hub)
    try:
        for sid in ("one", "two"):
            manager.add(StreamSpec(id=sid, url=str(SAMPLE), realtime=False, loop=True))
        wait_until(
            lambda: min(manager.get(s).frames_processed for s in ("one", "two")) >= 20,
            120,
            what="20 results per stream",
        )
        for sid in ("one", "two"):
            results = hub.since(0, sid)
            assert [r.frame_index for r in results] == sorted(r.frame_index for r in results)
            assert [r.seq for r in results] == sorted(r.seq for r in results)
            assert all(r.published_time >= r.arrival_time for r in results)
        manager.remove("one")
        last = hub.last_seq
        wait_until(lambda: hub.last_seq > last + 10, 60, what="more results of 'two'")
        assert not [r for r in hub.since(last) if r.source_id == "one"]
    finally:
        manager.close()


def test_a_result_that_fails_to_publish_is_logged_and_publishing_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    hub = ResultsHub(capacity_per_source=4096, capacity_total=8192)
    original = hub.publish
    failed = threading.Event()

    def publish_once_failing(result: DetectionResult) -> DetectionResult:
        if not failed.is_set():
            failed.set()
            raise RuntimeError("hub refused the result")
        return original(result)

    hub.publish = publish_once_failing  # type: ignore[method-assign]
    manager = _manager(hub)
    try:
        with caplog.at_level(logging.ERROR, logger="vdet.streams.manager"):
            manager.add(StreamSpec(id="cam", url=str(SAMPLE), realtime=False, loop=True))
            wait_until(lambda: manager.get("cam").frames_processed >= 5, 60, what="5 results")
        assert failed.is_set() and "publishing a result of cam failed" in caplog.text
    finally:
        manager.close()


class _StuckMetrics(Metrics):
    """The publisher's last step stops until told to go on: a publisher falling behind (as
    one relaying results to another process can)."""

    def __init__(self) -> None:
        super().__init__()
        self.go_on = threading.Event()

    def observe_result(self, result: DetectionResult) -> None:
        self.go_on.wait(30)
        super().observe_result(result)


def test_a_publisher_that_falls_behind_holds_the_pipeline_back_instead_of_queueing() -> None:
    """An unpaced file behind a stuck publisher: decoding stops after a bounded number of
    frames (the outbox's share, the mailbox, the frame in detection), and everything resumes,
    none lost, once the publisher goes on."""
    hub = ResultsHub(capacity_per_source=4096, capacity_total=8192)
    metrics = _StuckMetrics()
    manager = StreamManager(_NoBoxes(), ("a", "b"), hub, metrics, max_streams=1)
    try:
        manager.add(StreamSpec(id="cam", url=str(SAMPLE), realtime=False))
        wait_until(lambda: manager.get("cam").status.frames_decoded >= 3, 30, what="decoding")
        threading.Event().wait(1.0)  # unbounded, this fast detector would go through ~100
        held = manager.get("cam").status.frames_decoded
        # the run the publisher took (at most the outbox's 4), the outbox, the mailbox, the
        # frame in detection, the decoder's
        assert held <= 4 + 4 + 1 + 1 + 1
        metrics.go_on.set()
        wait_until(lambda: manager.get("cam").frames_processed >= 60, 60, what="60 results")
        assert [r.frame_index for r in hub.since(0, "cam")][:60] == list(range(60))
    finally:
        metrics.go_on.set()
        manager.close()


class _FlushCountingHub(ResultsHub):
    """A hub that notes how many results each `flush` followed (a worker's sink sends them
    as one message on flush)."""

    def __init__(self) -> None:
        super().__init__(capacity_per_source=4096, capacity_total=8192)
        self.published = 0
        self.since_flush = 0
        self.flushed: list[int] = []

    def publish(self, result: DetectionResult) -> DetectionResult:
        self.published += 1
        self.since_flush += 1
        return super().publish(result)

    def flush(self) -> None:
        if self.since_flush:
            self.flushed.append(self.since_flush)
            self.since_flush = 0


def test_the_publisher_flushes_its_sink_once_per_run_of_waiting_results() -> None:
    """Results that queued while the publisher was busy are published together and flushed
    once; every published result is flushed by the time the manager has closed."""
    hub = _FlushCountingHub()
    metrics = _StuckMetrics()
    manager = StreamManager(_NoBoxes(), ("a", "b"), hub, metrics, max_streams=1)
    try:
        manager.add(StreamSpec(id="cam", url=str(SAMPLE), realtime=False))
        wait_until(lambda: manager.get("cam").status.frames_decoded >= 6, 30, what="a backlog")
        metrics.go_on.set()
        wait_until(lambda: manager.get("cam").frames_processed >= 30, 60, what="30 results")
    finally:
        metrics.go_on.set()
        manager.close()
    assert max(hub.flushed) > 1  # the backlog went out in runs, not one flush per result
    assert hub.since_flush == 0 and sum(hub.flushed) == hub.published >= 30
