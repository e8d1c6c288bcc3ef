from __future__ import annotations

import dataclasses
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support.ingest import Transition, drain, start_worker, take_in_background
from support.waiting import wait_until

from vdet.core.types import SourceState, VideoFrame
from vdet.ingest.mailbox import FrameMailbox
from vdet.ingest.source_thread import IngestOptions, SourceThread, backoff_delay

# ------------------------------------------------------------------ options and backoff


def test_default_options_are_the_documented_ones() -> None:
    options = IngestOptions()
    assert dataclasses.asdict(options) == {
        "connect_timeout_s": 5.0,
        "read_timeout_s": 5.0,
        "stall_timeout_s": 5.0,
        "backoff_initial_s": 0.5,
        "backoff_max_s": 30.0,
        "backoff_multiplier": 2.0,
        "jitter": 0.2,
        "loop_files": False,
        "realtime": False,
        "max_consecutive_decode_errors": 50,
        "pass_damaged_frames": False,
        "policy": None,
    }


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"connect_timeout_s": 0.0}, "connect_timeout_s must be in"),
        ({"read_timeout_s": -1.0}, "read_timeout_s must be in"),
        ({"stall_timeout_s": 1e6}, "stall_timeout_s must be in"),
        ({"backoff_multiplier": 0.5}, "backoff_multiplier must be in"),
        ({"jitter": 1.5}, "jitter must be in"),
        ({"max_consecutive_decode_errors": 0}, "max_consecutive_decode_errors must be in"),
        ({"backoff_initial_s": 10.0, "backoff_max_s": 5.0}, "must not exceed"),
        ({"connect_timeout_s": "5"}, "must be a number"),
        ({"jitter": True}, "must be a number"),
    ],
)
def test_options_out_of_bounds_are_rejected(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        IngestOptions(**changes)


def test_backoff_doubles_up_to_the_cap_without_jitter() -> None:
    options = IngestOptions(jitter=0.0)
    rng = random.Random(0)
    delays = [backoff_delay(n, options, rng) for n in range(1, 10)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert backoff_delay(10_000, options, rng) == 30.0  # no overflow


def test_backoff_jitter_spreads_within_its_fraction_and_never_exceeds_the_cap() -> None:
    options = IngestOptions(jitter=0.2)
    rng = random.Random(0)
    early = [backoff_delay(2, options, rng) for _ in range(500)]
    assert min(early) >= 0.8
    assert max(early) <= 1.2
    assert max(early) - min(early) > 0.2  # it does spread
    capped = [backoff_delay(50, options, rng) for _ in range(500)]
    assert max(capped) <= 30.0
    assert min(capped) >= 24.0


# ------------------------------------------------------------------------ file sources


def test_a_file_is_read_once_then_the_worker_stops(
    workers: list[SourceThread], h264_clip: Path, fast_options: IngestOptions
) -> None:
    transitions: list[Transition] = []
    worker = start_worker(workers, str(h264_clip), fast_options, transitions)
    frames = drain(worker.mailbox)  # ends when the worker closes its mailbox
    worker.join(5)
    assert not worker.is_alive()
    status = worker.status()
    assert status.state is SourceState.STOPPED
    assert status.frames_decoded == 120
    assert status.frames_dropped + len(frames) == 120
    assert frames[-1].index == 119
    assert (status.width, status.height, status.fps_nominal) == (640, 360, 30.0)
    assert status.fps is not None and status.fps > 0  # measured: unpaced, as fast as it decodes
    assert status.attempts == 1
    assert status.reconnects == 0
    assert status.last_error is None
    assert status.last_frame_time is not None
    assert transitions == [
        ("cam", SourceState.CONNECTING, SourceState.STREAMING),
        ("cam", SourceState.STREAMING, SourceState.STOPPED),
    ]
    assert "end of file" in status.history[-1]
    assert worker.stop(timeout=1)  # already stopped: a no-op


def test_status_is_a_copy(
    workers: list[SourceThread], h264_clip: Path, fast_options: IngestOptions
) -> None:
    worker = start_worker(workers, str(h264_clip), fast_options)
    take_in_background(worker.mailbox)
    worker.join(10)
    status = worker.status()
    status.history.clear()
    status.frames_decoded = -1
    assert worker.status().history
    assert worker.status().frames_decoded == 120


def test_a_file_not_paced_hands_over_every_frame_at_the_pace_of_its_reader(
    workers: list[SourceThread], h264_clip: Path, fast_options: IngestOptions
) -> None:
    transitions: list[Transition] = []
    worker = start_worker(workers, str(h264_clip), fast_options, transitions)
    frames = []
    while (taken := worker.mailbox.get(timeout=10)) is not None:
        frames.append(taken)
        if taken.index == 10:
            # A reader slower than the stall timeout (1 s here) is not a stalled source.
            time.sleep(1.5)
        else:
            time.sleep(0.002)
    worker.join(5)
    status = worker.status()
    assert [f.index for f in frames] == list(range(120))
    assert status.frames_dropped == 0
    assert status.state is SourceState.STOPPED
    assert SourceState.STALLED not in {t[2] for t in transitions}


def test_stop_is_prompt_while_a_file_waits_for_its_reader(
    workers: list[SourceThread], h264_clip: Path, fast_options: IngestOptions
) -> None:
    worker = start_worker(workers, str(h264_clip), fast_options)
    wait_until(lambda: worker.mailbox.pending, 10, what="a frame waiting")
    time.sleep(0.2)  # nobody takes it: the worker waits to hand over the next
    assert worker.status().frames_decoded <= 3
    started = time.monotonic()
    assert worker.stop(timeout=5)
    assert time.monotonic() - started < 1.0
    assert worker.status().state is SourceState.STOPPED


def test_a_looping_file_streams_like_a_camera(
    workers: list[SourceThread], h264_clip: Path, fast_options: IngestOptions
) -> None:
    options = dataclasses.replace(fast_options, loop_files=True)
    worker = start_worker(workers, str(h264_clip), options)
    frame = None
    deadline = time.monotonic() + 15
    while worker.status().frames_decoded <= 300 and time.monotonic() < deadline:
        frame = worker.mailbox.get(timeout=5)
    status = worker.status()
    assert status.frames_decoded > 300  # three loops
    assert status.state is SourceState.STREAMING
    assert status.attempts == 1
    assert frame is not None
    assert frame.pts_seconds is not None
    assert frame.pts_seconds > 4.0  # times go on rising across loops, as a camera's do
    started = time.monotonic()
    assert worker.stop(timeout=5)
    assert time.monotonic() - started < 1.0
    assert worker.status().state is SourceState.STOPPED


def test_a_realtime_file_delivers_at_its_frame_rate(
    workers: list[SourceThread], h264_clip: Path, fast_options: IngestOptions
) -> None:
    options = dataclasses.replace(fast_options, loop_files=True, realtime=True)
    worker = start_worker(workers, str(h264_clip), options)
    wait_until(lambda: worker.state is SourceState.STREAMING, 10, what="streaming")
    first = worker.status().frames_decoded
    time.sleep(1.0)
    produced = worker.status().frames_decoded - first
    assert 15 <= produced <= 60  # 30 expected


def test_a_corrupt_file_records_errors_and_the_worker_goes_on(
    workers: list[SourceThread], corrupt_clip: Path, fast_options: IngestOptions
) -> None:
    worker = start_worker(workers, str(corrupt_clip), fast_options)
    take_in_background(worker.mailbox)
    worker.join(10)
    status = worker.status()
    assert status.state is SourceState.STOPPED
    assert "end of file" in status.history[-1]
    assert worker.decode_errors > 0
    assert status.last_error is not None
    assert status.last_error.startswith("decode error")
    assert 10 < status.frames_decoded < 120


def test_too_many_consecutive_decode_errors_reconnect(
    workers: list[SourceThread], corrupt_clip: Path, fast_options: IngestOptions
) -> None:
    options = dataclasses.replace(fast_options, loop_files=True, max_consecutive_decode_errors=3)
    transitions: list[Transition] = []
    worker = start_worker(workers, str(corrupt_clip), options, transitions)
    take_in_background(worker.mailbox)
    wait_until(lambda: worker.status().attempts >= 3, 15, what="reconnects")
    assert ("cam", SourceState.STREAMING, SourceState.FAILED) in transitions
    assert ("cam", SourceState.FAILED, SourceState.BACKOFF) in transitions
    status = worker.status()
    assert any("consecutive decode errors" in line for line in status.history)
    assert status.reconnects >= 1  # frames flowed again after each reconnect
    assert worker.is_alive()


def test_a_missing_file_is_rejected_up_front(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        SourceThread("cam", str(tmp_path / "nope.mp4"), FrameMailbox())


def test_a_file_that_is_no_video_fails_for_good(
    workers: list[SourceThread], h264_clip: Path, tmp_path: Path, fast_options: IngestOptions
) -> None:
    clip = tmp_path / "clip.mp4"
    clip.write_bytes(h264_clip.read_bytes()[:100])  # exists, but is no video
    worker = start_worker(workers, str(clip), fast_options)
    wait_until(lambda: not worker.is_alive(), 10, what="the worker to give up")
    status = worker.status()
    assert status.state is SourceState.FAILED  # not retried: a file does not heal itself
    assert status.attempts == 1
    assert status.last_error is not None and "cannot open the file" in status.last_error


# ---------------------------------------------------------------------- failing cameras


def test_an_unreachable_camera_backs_off_and_keeps_trying(
    workers: list[SourceThread], closed_port: int, fast_options: IngestOptions
) -> None:
    transitions: list[Transition] = []
    worker = start_worker(workers, f"rtsp://127.0.0.1:{closed_port}/cam", fast_options, transitions)
    wait_until(lambda: worker.status().attempts >= 4, 10, what="attempts")
    status = worker.status()
    assert status.last_error is not None
    assert "refused" in status.last_error.lower()
    assert status.frames_decoded == 0
    assert status.reconnects == 0
    assert status.state in (SourceState.CONNECTING, SourceState.FAILED, SourceState.BACKOFF)
    assert worker.is_alive()
    states = [new for _, _, new in transitions]
    assert SourceState.STREAMING not in states
    assert states[:3] == [SourceState.FAILED, SourceState.BACKOFF, SourceState.CONNECTING]
    backoffs = [line for line in status.history if "->backoff" in line]
    assert len(backoffs) >= 3


def test_a_hung_camera_fails_after_the_connect_timeout(
    workers: list[SourceThread], silent_port: int, fast_options: IngestOptions
) -> None:
    options = dataclasses.replace(fast_options, connect_timeout_s=0.3)
    worker = start_worker(workers, f"rtsp://127.0.0.1:{silent_port}/cam", options)
    wait_until(lambda: worker.status().attempts >= 3, 10, what="attempts")
    assert worker.status().last_error is not None


def test_a_failing_state_callback_does_not_stop_the_worker(
    workers: list[SourceThread], h264_clip: Path, fast_options: IngestOptions
) -> None:
    def explode(*_: object) -> None:
        raise RuntimeError("callback bug")

    worker = SourceThread(
        "cam", str(h264_clip), FrameMailbox(), fast_options, on_state_change=explode
    )
    workers.append(worker)
    worker.start()
    take_in_background(worker.mailbox)
    worker.join(10)
    assert worker.status().frames_decoded == 120


# ------------------------------------------------------------------------------- stop()


def test_stop_before_start_is_immediate(h264_clip: Path) -> None:
    worker = SourceThread("cam", str(h264_clip), FrameMailbox())
    assert worker.stop(timeout=1)
    assert worker.state is SourceState.STOPPED
    assert worker.mailbox.closed


def test_stop_is_prompt_while_backing_off(workers: list[SourceThread], closed_port: int) -> None:
    options = IngestOptions(backoff_initial_s=60, backoff_max_s=60)
    worker = start_worker(workers, f"rtsp://127.0.0.1:{closed_port}/cam", options)
    wait_until(lambda: worker.state is SourceState.BACKOFF, 5, what="backoff")
    started = time.monotonic()
    assert worker.stop(timeout=5)
    assert time.monotonic() - started < 1.0
    assert worker.state is SourceState.STOPPED


@pytest.mark.parametrize("scheme", ["rtsp", "http"])
def test_stop_is_prompt_while_a_connect_hangs(
    workers: list[SourceThread], silent_port: int, scheme: str
) -> None:
    options = IngestOptions(connect_timeout_s=60, read_timeout_s=60, stall_timeout_s=60)
    worker = start_worker(workers, f"{scheme}://127.0.0.1:{silent_port}/cam", options)
    wait_until(lambda: worker.status().attempts == 1, 5, what="an attempt")
    time.sleep(0.3)  # inside FFmpeg's connect by now
    assert worker.state is SourceState.CONNECTING
    started = time.monotonic()
    assert worker.stop(timeout=5)
    assert time.monotonic() - started < 1.5
    status = worker.status()
    assert status.state is SourceState.STOPPED
    assert status.attempts == 1  # stopping is not a failure to retry


def test_stop_is_prompt_while_streaming(
    workers: list[SourceThread], h264_clip: Path, fast_options: IngestOptions
) -> None:
    options = dataclasses.replace(fast_options, loop_files=True, realtime=True)
    worker = start_worker(workers, str(h264_clip), options)
    wait_until(lambda: worker.state is SourceState.STREAMING, 10, what="streaming")
    received: list[VideoFrame] = []
    consumer = threading.Thread(target=lambda: received.extend(drain(worker.mailbox)))
    consumer.start()
    started = time.monotonic()
    assert worker.stop(timeout=5)
    assert time.monotonic() - started < 1.0
    consumer.join(5)
    assert not consumer.is_alive()  # the closed mailbox released the consumer
