"""A live view's frames: the newest decoded frame runs ahead of detection, with the newest
result. Stand-in detector (DetectorLike) slower than the video's frame rate, on real video
decoded on the CPU at its own pace."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import numpy as np
import pytest
from support.truth import SAMPLE
from support.waiting import wait_until

from vdet.config.streams import StreamSpec
from vdet.core.types import Detections, ImageArray, StageTimings
from vdet.inference.postprocess import PostprocessParams
from vdet.metrics.registry import Metrics
from vdet.results.hub import ResultsHub
from vdet.streams.local import encode_picture
from vdet.streams.manager import StreamManager
from vdet.streams.service import PictureRequest

DETECT_S = 0.2  # six frames of the 30 fps clip go by while one is detected


class _SlowDetector:
    """One box per frame, found after DETECT_S."""

    def detect(
        self, images: Sequence[ImageArray], params: PostprocessParams | None = None
    ) -> list[tuple[Detections, StageTimings]]:
        time.sleep(DETECT_S)
        box = Detections(
            np.array([[10.0, 10.0, 200.0, 300.0]], np.float32),
            np.array([0.9], np.float32),
            np.array([0], np.int64),
        )
        return [(box, StageTimings(inference=DETECT_S)) for _ in images]


@pytest.fixture
def manager() -> Iterator[StreamManager]:
    hub = ResultsHub(capacity_per_source=64, capacity_total=64)
    streams = StreamManager(_SlowDetector(), ("person",), hub, Metrics(), max_streams=1)
    streams.add(StreamSpec(id="cam", url=str(SAMPLE), realtime=True, loop=True))
    try:
        wait_until(lambda: streams.get("cam").frames_processed >= 2, 60, what="two results")
        yield streams
    finally:
        streams.close()


def test_the_newest_frame_runs_ahead_of_the_last_processed_one(manager: StreamManager) -> None:
    processed = manager.snapshot("cam")
    newest = manager.newest_frame("cam")
    assert processed is not None and newest is not None
    assert processed.frame.index == processed.result.frame_index  # its own result
    assert newest.frame.index > newest.result.frame_index  # decoded since that result
    assert newest.result.seq >= processed.result.seq


def test_a_live_encode_says_which_frame_and_which_result_and_skips_a_repeat(
    manager: StreamManager,
) -> None:
    options = {"quality": 70, "max_width": 320}
    live = encode_picture(
        manager, "cam", PictureRequest(boxes=True, newest=True, unless=None, **options)
    )
    assert live is not None
    assert live.frame_index > live.result_frame_index
    assert live.picture == (live.frame_index, live.result_frame_index)
    assert (live.width, live.source_width) == (320, 1920)
    # The same picture again (nothing decoded or detected since): not encoded twice.
    for _ in range(100):
        again = encode_picture(
            manager, "cam", PictureRequest(boxes=True, newest=True, unless=None, **options)
        )
        assert again is not None
        repeat = encode_picture(
            manager, "cam", PictureRequest(boxes=True, newest=True, unless=again.picture, **options)
        )
        if repeat is None:
            break  # (a frame decoded between the two calls is a new picture: try again)
        assert repeat.picture != again.picture
    else:
        pytest.fail("every encode showed a new picture")
    processed = encode_picture(
        manager, "cam", PictureRequest(boxes=False, newest=False, unless=None, **options)
    )
    assert processed is not None
    assert processed.frame_index == processed.result_frame_index
    assert processed.picture == (processed.frame_index, None)


def test_newest_frames_keep_coming_while_detection_lags(manager: StreamManager) -> None:
    seen: list[int] = []
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        snap = manager.newest_frame("cam")
        assert snap is not None
        if not seen or snap.frame.index != seen[-1]:
            seen.append(snap.frame.index)
        time.sleep(0.02)
    assert seen == sorted(seen)
    # About 30 frames decoded in that second, about 5 detected: the view sees most of them.
    assert len(seen) >= 15, seen
