"""End to end through a real RTSP server (GStreamer, in a subprocess) on loopback."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
from support.ingest import Transition, start_worker
from support.rtsp import RtspServerFactory
from support.waiting import wait_until

from vdet.core.types import SourceState, VideoFrame
from vdet.ingest.source_thread import IngestOptions, SourceThread


def take(worker: SourceThread, count: int, timeout: float = 10.0) -> list[VideoFrame]:
    frames: list[VideoFrame] = []
    deadline = time.monotonic() + timeout
    while len(frames) < count and time.monotonic() < deadline:
        frame = worker.mailbox.get(timeout=0.5)
        if frame is not None:
            frames.append(frame)
    assert len(frames) == count, f"got {len(frames)} of {count} frames"
    return frames


@pytest.mark.parametrize("clip_fixture", ["h264_clip", "h264_bframes_clip"])
def test_frames_arrive_from_an_rtsp_camera(
    rtsp_server_factory: RtspServerFactory,
    workers: list[SourceThread],
    fast_options: IngestOptions,
    clip_fixture: str,
    request: pytest.FixtureRequest,
) -> None:
    server = rtsp_server_factory(request.getfixturevalue(clip_fixture))
    worker = start_worker(workers, server.url, fast_options)
    frames = take(worker, 45)  # 1.5 s of video: the stream is real time and loops
    status = worker.status()
    assert status.state is SourceState.STREAMING
    assert (status.width, status.height) == (640, 360)
    assert status.fps_nominal == pytest.approx(30.0)
    assert all(f.size_wh == (640, 360) for f in frames)
    assert all(f.source_id == "cam" for f in frames)
    indexes = [f.index for f in frames]
    assert indexes == sorted(set(indexes))
    pts = [f.pts_seconds for f in frames if f.pts_seconds is not None]
    assert pts == sorted(pts)
    assert len(pts) >= len(frames) - 1  # FFmpeg may leave the very first frame without pts
    span = frames[-1].arrival_time - frames[0].arrival_time
    assert 0.6 <= span <= 4.0  # 44 frame periods at 30 fps: 1.47 s, paced by the server
    assert worker.status().frames_decoded >= 45


def test_a_killed_camera_is_reconnected_when_it_comes_back(
    rtsp_server_factory: RtspServerFactory,
    workers: list[SourceThread],
    fast_options: IngestOptions,
    h264_clip: Path,
) -> None:
    server = rtsp_server_factory(h264_clip)
    transitions: list[Transition] = []
    worker = start_worker(workers, server.url, fast_options, transitions)
    first_run = take(worker, 10)

    server.kill()
    wait_until(
        lambda: worker.status().attempts >= 3, 15, what="reconnect attempts while it is down"
    )
    down = worker.status()
    assert down.state in (SourceState.CONNECTING, SourceState.FAILED, SourceState.BACKOFF)
    assert down.last_error is not None
    assert down.reconnects == 0
    lost = [new for _, old, new in transitions if old is SourceState.STREAMING]
    assert lost[0] in (SourceState.FAILED, SourceState.STALLED)

    server.start()  # same port
    wait_until(
        lambda: worker.status().reconnects == 1, 15, what="streaming again after the restart"
    )
    second_run = take(worker, 10)
    status = worker.status()
    assert status.state is SourceState.STREAMING
    # Frame indexes keep counting across the reconnect.
    assert second_run[0].index > first_run[-1].index
    assert status.frames_decoded >= len(first_run) + len(second_run)
    assert transitions[-1] == ("cam", SourceState.CONNECTING, SourceState.STREAMING)
    states = [new for _, _, new in transitions]
    assert SourceState.BACKOFF in states


def test_a_hung_camera_is_detected_as_stalled_and_recovers(
    rtsp_server_factory: RtspServerFactory,
    workers: list[SourceThread],
    fast_options: IngestOptions,
    h264_clip: Path,
) -> None:
    server = rtsp_server_factory(h264_clip)
    # A read timeout far beyond the stall timeout: only the watchdog can notice the stall.
    options = dataclasses.replace(
        fast_options, read_timeout_s=60, stall_timeout_s=1.0, connect_timeout_s=1.0
    )
    transitions: list[Transition] = []
    worker = start_worker(workers, server.url, options, transitions)
    take(worker, 5)

    server.pause()  # the TCP connection stays up; nothing more arrives
    paused_at = time.monotonic()
    wait_until(
        lambda: ("cam", SourceState.STREAMING, SourceState.STALLED) in transitions,
        10,
        what="stalled",
    )
    assert time.monotonic() - paused_at < 5.0
    assert any("no frame for" in line for line in worker.status().history)
    wait_until(lambda: worker.status().attempts >= 2, 10, what="a reconnect attempt")

    server.resume()
    wait_until(lambda: worker.status().reconnects >= 1, 20, what="streaming again")
    take(worker, 5)
    assert worker.state is SourceState.STREAMING


def test_stop_is_prompt_while_a_read_hangs(
    rtsp_server_factory: RtspServerFactory,
    workers: list[SourceThread],
    h264_clip: Path,
) -> None:
    server = rtsp_server_factory(h264_clip)
    options = IngestOptions(connect_timeout_s=5, read_timeout_s=60, stall_timeout_s=60)
    worker = start_worker(workers, server.url, options)
    take(worker, 5)
    server.pause()
    time.sleep(0.5)  # the worker is now blocked reading from the paused server
    assert worker.state is SourceState.STREAMING
    started = time.monotonic()
    assert worker.stop(timeout=5)
    assert time.monotonic() - started < 1.5
    assert worker.state is SourceState.STOPPED
    server.resume()
