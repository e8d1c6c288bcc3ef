from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from vdet.core.types import VideoFrame
from vdet.ingest.mailbox import FrameMailbox


def frame(index: int) -> VideoFrame:
    return VideoFrame(
        source_id="cam",
        index=index,
        image_bgr=np.zeros((4, 6, 3), np.uint8),
        pts_seconds=index / 30,
        arrival_time=time.time(),
        decode_seconds=0.0,
    )


def test_get_returns_the_newest_frame_and_counts_the_replaced_ones() -> None:
    box = FrameMailbox()
    assert box.put(frame(0))
    assert box.put(frame(1))
    assert box.put(frame(2))
    assert box.pending
    got = box.get(timeout=0)
    assert got is not None
    assert got.index == 2
    assert (box.dropped, box.delivered, box.put_count) == (2, 1, 3)
    assert box.get(timeout=0) is None
    assert not box.pending


def test_consumed_frames_are_not_counted_as_dropped() -> None:
    box = FrameMailbox()
    for i in range(5):
        box.put(frame(i))
        got = box.get(timeout=0)
        assert got is not None
        assert got.index == i
    assert (box.dropped, box.delivered) == (0, 5)


def test_get_times_out_with_none() -> None:
    box = FrameMailbox()
    started = time.monotonic()
    assert box.get(timeout=0.05) is None
    assert 0.04 <= time.monotonic() - started < 1.0


def test_get_wakes_when_a_frame_is_put_from_another_thread() -> None:
    box = FrameMailbox()
    threading.Timer(0.05, box.put, args=(frame(7),)).start()
    got = box.get(timeout=5)
    assert got is not None
    assert got.index == 7


def test_close_wakes_every_waiting_getter() -> None:
    box = FrameMailbox()
    results: list[VideoFrame | None] = []
    waiters = [threading.Thread(target=lambda: results.append(box.get())) for _ in range(3)]
    for waiter in waiters:
        waiter.start()
    time.sleep(0.05)
    box.close()
    for waiter in waiters:
        waiter.join(2)
        assert not waiter.is_alive()
    assert results == [None, None, None]


def test_a_closed_box_hands_out_its_last_frame_then_refuses_new_ones() -> None:
    box = FrameMailbox()
    box.put(frame(1))
    box.close()
    box.close()  # idempotent
    assert box.closed
    assert not box.put(frame(2))
    got = box.get(timeout=0)
    assert got is not None
    assert got.index == 1
    assert box.get() is None  # closed and empty: no wait even without a timeout
    assert box.put_count == 1


def test_a_fast_producer_never_blocks_and_every_frame_is_accounted_for() -> None:
    box = FrameMailbox()
    produced = 5000
    received: list[int] = []

    def consume() -> None:
        while (got := box.get(timeout=2)) is not None:
            received.append(got.index)
            time.sleep(0.0005)  # a slow consumer

    consumer = threading.Thread(target=consume)
    consumer.start()
    started = time.monotonic()
    for i in range(produced):
        box.put(frame(i))
    put_seconds = time.monotonic() - started
    box.close()
    consumer.join(5)
    assert not consumer.is_alive()
    assert received == sorted(received)  # newest-first never goes backwards
    assert received[-1] == produced - 1  # the last frame is never lost
    assert box.delivered == len(received)
    assert box.dropped + box.delivered == produced
    assert box.dropped > 0
    assert put_seconds < 5.0


class _GpuFrame:
    """Stands in for a frame in GPU memory: any DecodedFrame that is not a VideoFrame."""

    source_id = "cam"
    index = 7
    pts_seconds = None
    arrival_time = 0.0
    decode_seconds = 0.0
    size_wh = (6, 4)


def test_the_newest_host_frame_stays_visible_after_it_is_taken() -> None:
    box = FrameMailbox()
    assert box.newest_on_host is None
    box.put(frame(0))
    box.put(frame(1))
    taken = box.get(timeout=0)
    newest = box.newest_on_host
    assert taken is not None and newest is taken  # the same frame, no copy
    box.put(frame(2))
    assert box.newest_on_host is not None and box.newest_on_host.index == 2


def test_gpu_frames_are_not_kept_and_close_lets_go_of_the_newest() -> None:
    box = FrameMailbox()
    box.put(frame(3))
    box.put(_GpuFrame())
    newest = box.newest_on_host
    assert newest is not None and newest.index == 3  # a pooled GPU surface is never held
    box.close()
    assert box.newest_on_host is None


def test_a_lossless_put_waits_until_the_waiting_frame_is_taken() -> None:
    box = FrameMailbox()
    assert box.put(frame(0), keep_waiting=lambda: True)
    second_put = threading.Thread(
        target=box.put, args=(frame(1),), kwargs={"keep_waiting": lambda: True}
    )
    second_put.start()
    second_put.join(0.3)
    assert second_put.is_alive()  # frame 0 not taken yet: frame 1 waits, nothing dropped
    first = box.get(timeout=1)
    second_put.join(5)
    assert not second_put.is_alive()
    second = box.get(timeout=1)
    assert first is not None and second is not None
    assert (first.index, second.index) == (0, 1)
    assert (box.dropped, box.delivered, box.put_count) == (0, 2, 2)


def test_a_lossless_put_that_is_told_to_stop_waiting_replaces_the_frame() -> None:
    box = FrameMailbox()
    box.put(frame(0))
    asked: list[float] = []

    def keep_waiting() -> bool:
        asked.append(time.monotonic())
        return len(asked) < 3

    started = time.monotonic()
    assert box.put(frame(1), keep_waiting=keep_waiting)
    assert len(asked) == 3
    assert time.monotonic() - started < 2.0
    got = box.get(timeout=0)
    assert got is not None and got.index == 1
    assert box.dropped == 1


def test_a_deeper_lossless_queue_takes_frames_ahead_and_hands_them_out_in_order() -> None:
    box = FrameMailbox(lossless_depth=3)
    for i in range(3):  # three frames queue without waiting
        assert box.put(frame(i), keep_waiting=lambda: True)
    fourth_put = threading.Thread(
        target=box.put, args=(frame(3),), kwargs={"keep_waiting": lambda: True}
    )
    fourth_put.start()
    fourth_put.join(0.3)
    assert fourth_put.is_alive()  # the queue is full: frame 3 waits for room
    taken = [box.get(timeout=1)]
    fourth_put.join(5)
    assert not fourth_put.is_alive()
    taken += [box.get(timeout=1) for _ in range(3)]
    assert [f.index for f in taken if f is not None] == [0, 1, 2, 3]
    assert (box.dropped, box.delivered, box.put_count) == (0, 4, 4)
    assert not box.pending


def test_a_deeper_queue_stays_latest_only_for_a_live_producer() -> None:
    """Depth is for lossless producers: a camera's frames still replace the waiting one."""
    box = FrameMailbox(lossless_depth=3)
    for i in range(3):
        assert box.put(frame(i))
    got = box.get(timeout=0)
    assert got is not None and got.index == 2
    assert box.get(timeout=0) is None
    assert box.dropped == 2


def test_a_full_lossless_queue_told_to_stop_waiting_drops_its_oldest() -> None:
    box = FrameMailbox(lossless_depth=2)
    box.put(frame(0), keep_waiting=lambda: True)
    box.put(frame(1), keep_waiting=lambda: True)
    assert box.put(frame(2), keep_waiting=lambda: False)
    taken = [box.get(timeout=0), box.get(timeout=0)]
    assert [f.index for f in taken if f is not None] == [1, 2]
    assert box.dropped == 1


def test_a_closed_deeper_queue_still_hands_out_every_frame_put_before() -> None:
    box = FrameMailbox(lossless_depth=4)
    for i in range(3):
        box.put(frame(i), keep_waiting=lambda: True)
    box.close()
    assert not box.put(frame(3), keep_waiting=lambda: True)
    taken = [box.get(timeout=0) for _ in range(4)]
    assert [f.index if f is not None else None for f in taken] == [0, 1, 2, None]


def test_the_lossless_depth_is_checked() -> None:
    for bad in (0, -1):
        with pytest.raises(ValueError, match="at least 1"):
            FrameMailbox(lossless_depth=bad)
    with pytest.raises(TypeError, match="must be an int"):
        FrameMailbox(lossless_depth=True)


def test_closing_the_box_releases_a_waiting_lossless_put() -> None:
    box = FrameMailbox()
    box.put(frame(0))
    results: list[bool] = []
    waiting = threading.Thread(
        target=lambda: results.append(box.put(frame(1), keep_waiting=lambda: True))
    )
    waiting.start()
    time.sleep(0.05)
    box.close()
    waiting.join(5)
    assert results == [False]
    got = box.get(timeout=0)  # the frame put before close is still handed out
    assert got is not None and got.index == 0


def test_detect_fps_lets_unwanted_frames_go_without_dropping_the_wanted_one() -> None:
    # 30 fps frames at detect_fps 10: frames 1 and 2 are let go at once (skipped), so they
    # cannot replace frame 0 while nobody has taken it yet; frame 3 then does (dropped).
    box = FrameMailbox()
    box.set_detect_fps(10)
    assert all(box.put(frame(i)) for i in range(3))
    assert (box.skipped, box.dropped, box.put_count) == (2, 0, 1)
    assert box.newest_on_host is not None and box.newest_on_host.index == 2  # the live view
    got = box.get(timeout=0)
    assert got is not None and got.index == 0
    assert all(box.put(frame(i)) for i in range(3, 9))
    assert (box.skipped, box.dropped, box.put_count) == (6, 1, 3)
    got = box.get(timeout=0)
    assert got is not None and got.index == 6


def test_a_lossless_put_of_an_unwanted_frame_does_not_wait() -> None:
    box = FrameMailbox()
    box.set_detect_fps(10)
    assert box.put(frame(0), keep_waiting=lambda: True)
    started = time.monotonic()
    assert box.put(frame(1), keep_waiting=lambda: True)  # frame 0 still waiting: no matter
    assert time.monotonic() - started < 0.05
    box.set_detect_fps(None)  # every frame again, from the next put
    assert box.put(frame(2), keep_waiting=lambda: False)
    assert (box.skipped, box.dropped) == (1, 1)
