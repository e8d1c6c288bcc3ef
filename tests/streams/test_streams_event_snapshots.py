"""Event snapshots: which frames are kept (those with events, the newest per stream), what the
JPEG shows (the frame scaled to max_width, boxes drawn: decoded back with OpenCV), and the
bounds (a full queue skips, never blocks; a removed stream keeps nothing)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import cv2
import numpy as np
import pytest
from support.waiting import wait_until

from vdet.config.event_snapshots import EventSnapshotSettings
from vdet.core.types import (
    DecodedFrame,
    DetectionResult,
    Detections,
    ImageArray,
    StageTimings,
    VideoFrame,
    ZoneEvent,
)
from vdet.streams.event_snapshots import EventSnapshots

NAMES = ("person", "car")
ENTER = ZoneEvent("zone_enter", "door", 1, 0)
GREY = 128


def frame(index: int, wh: tuple[int, int] = (320, 240)) -> VideoFrame:
    image = np.full((wh[1], wh[0], 3), GREY, np.uint8)
    return VideoFrame(
        source_id="cam",
        index=index,
        pts_seconds=index / 30,
        arrival_time=1000.0 + index,
        decode_seconds=0.0,
        image_bgr=image,
    )


def result(
    index: int, *events: ZoneEvent, source: str = "cam", wh: tuple[int, int] = (320, 240)
) -> DetectionResult:
    boxes = Detections(
        xyxy=np.array([[40, 40, 120, 200]], np.float32),
        scores=np.array([0.9], np.float32),
        class_ids=np.array([0], np.int64),
    )
    return DetectionResult(
        source_id=source,
        frame_index=index,
        pts_seconds=index / 30,
        arrival_time=1000.0 + index,
        published_time=1000.1 + index,
        image_size_wh=wh,
        detections=boxes,
        timings=StageTimings(),
        events=events,
    )


def host_image(_source: str, decoded: DecodedFrame) -> ImageArray:
    assert isinstance(decoded, VideoFrame)
    return decoded.image_bgr


class HeldEncoder:
    """A `to_host_image` that holds each frame at the encoder until `gate` is set;
    `entered` tells that one has arrived there."""

    def __init__(self) -> None:
        self.gate, self.entered = threading.Event(), threading.Event()

    def __call__(self, source: str, decoded: DecodedFrame) -> ImageArray:
        self.entered.set()
        self.gate.wait(10)
        return host_image(source, decoded)


@pytest.fixture
def make() -> Iterator[Callable[..., EventSnapshots]]:
    made: list[EventSnapshots] = []

    def build(
        to_host_image: Callable[[str, DecodedFrame], ImageArray] = host_image, **fields: object
    ) -> EventSnapshots:
        snapshots = EventSnapshots(
            EventSnapshotSettings.model_validate(fields), NAMES, to_host_image
        )
        made.append(snapshots)
        return snapshots

    yield build
    for snapshots in made:
        snapshots.close()


def test_frames_with_events_are_kept_newest_last_and_others_never(
    make: Callable[..., EventSnapshots],
) -> None:
    snapshots = make(per_stream=3)
    snapshots.offer(result(0), frame(0))  # no events: no snapshot
    for index in range(1, 6):
        snapshots.offer(result(index, ENTER), frame(index))
        wait_until(lambda i=index: snapshots.get("cam", i), 5, what=f"frame {index} kept")
    assert [s.frame_index for s in snapshots.list("cam")] == [3, 4, 5]
    assert snapshots.get("cam", 0) is None and snapshots.get("cam", 2) is None
    assert snapshots.list("other") == []
    counts = snapshots.counts("cam")
    assert (counts.kept, counts.skipped, counts.failed) == (5, 0, 0)
    info = snapshots.list("cam")[-1]
    assert (info.events, info.pts_seconds, info.arrival_time) == ((ENTER,), 5 / 30, 1005.0)


def test_the_jpeg_is_the_frame_scaled_to_max_width_with_its_boxes_drawn(
    make: Callable[..., EventSnapshots],
) -> None:
    snapshots = make(max_width=160, quality=95)
    snapshots.offer(result(7, ENTER), frame(7))
    snap = wait_until(lambda: snapshots.get("cam", 7), 5, what="the snapshot")
    image = cv2.imdecode(np.frombuffer(snap.jpeg, np.uint8), cv2.IMREAD_COLOR)
    assert image.shape == (120, 160, 3) == (snap.info.height, snap.info.width, 3)
    assert snap.info.jpeg_bytes == len(snap.jpeg)
    # The box (40..120 x 40..200 at 320 wide: 20..60 x 20..100 here) is drawn over the grey:
    # its left edge differs from the frame; the middle of the box and the corner do not.
    assert np.abs(image[40:80, 18:23].astype(int) - GREY).max() > 20
    assert np.abs(image[60, 40].astype(int) - GREY).max() < 12
    assert np.abs(image[115, 155].astype(int) - GREY).max() < 12


def test_a_get_while_the_frame_is_encoded_waits_for_it(
    make: Callable[..., EventSnapshots],
) -> None:
    """A webhook receiver may ask for the snapshot its body names before the encoder is done."""
    held = HeldEncoder()
    snapshots = make(to_host_image=held)
    snapshots.offer(result(3, ENTER), frame(3))
    assert held.entered.wait(5)
    opener = threading.Timer(0.2, held.gate.set)
    opener.start()
    try:
        assert snapshots.get("cam", 3, wait_s=5) is not None
    finally:
        opener.join()
    started = time.monotonic()
    assert snapshots.get("cam", 4, wait_s=5) is None  # never offered: answered at once
    assert time.monotonic() - started < 1.0


def test_a_full_queue_skips_frames_without_blocking_the_caller(
    make: Callable[..., EventSnapshots],
) -> None:
    held = HeldEncoder()
    snapshots = make(to_host_image=held, queue=2)
    snapshots.offer(result(0, ENTER), frame(0))
    assert held.entered.wait(5)  # frame 0 at the encoder, held there
    started = time.monotonic()
    for index in range(1, 10):
        snapshots.offer(result(index, ENTER), frame(index))
    assert time.monotonic() - started < 1.0
    held.gate.set()
    wait_until(lambda: snapshots.counts("cam").kept + snapshots.counts("cam").skipped == 10, 5)
    counts = snapshots.counts("cam")
    # One frame at the encoder, two waiting: the other seven are skipped.
    assert (counts.kept, counts.skipped) == (3, 7)


def test_a_removed_stream_keeps_nothing_not_even_what_was_being_encoded(
    make: Callable[..., EventSnapshots],
) -> None:
    held = HeldEncoder()
    snapshots = make(to_host_image=held)
    snapshots.offer(result(1, ENTER), frame(1))
    assert held.entered.wait(5)
    snapshots.forget("cam")
    held.gate.set()
    snapshots.offer(result(2, ENTER, source="other"), frame(2))  # done after frame 1
    wait_until(lambda: snapshots.get("other", 2), 5, what="the other stream's snapshot")
    assert snapshots.list("cam") == [] and snapshots.counts("cam").kept == 0


def test_a_frame_that_cannot_be_encoded_is_counted_and_the_next_is_kept(
    make: Callable[..., EventSnapshots],
) -> None:
    def broken_once(source: str, decoded: DecodedFrame) -> ImageArray:
        if decoded.index == 1:
            raise RuntimeError("the GPU frame is gone")
        return host_image(source, decoded)

    snapshots = make(to_host_image=broken_once)
    snapshots.offer(result(1, ENTER), frame(1))
    snapshots.offer(result(2, ENTER), frame(2))
    wait_until(lambda: snapshots.get("cam", 2), 5, what="the next snapshot")
    counts = snapshots.counts("cam")
    assert (counts.kept, counts.failed) == (1, 1)


def test_close_returns_with_frames_still_queued() -> None:
    gate = threading.Event()

    def held(source: str, decoded: DecodedFrame) -> ImageArray:
        gate.wait(0.5)
        return host_image(source, decoded)

    snapshots = EventSnapshots(EventSnapshotSettings(queue=2), NAMES, held)
    for index in range(4):
        snapshots.offer(result(index, ENTER), frame(index))
    started = time.monotonic()
    snapshots.close()
    assert time.monotonic() - started < 5
