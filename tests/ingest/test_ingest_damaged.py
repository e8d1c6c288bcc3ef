"""Stream health that tells the truth: damaged video caught, errors shown and cleared, files
that cannot deliver end in `failed`, a silent camera reported as a timeout, measured fps.

The damaged clip is the sample clip with garbled packets (tests/support/videos.py): the
decoder conceals the lost data, and a detector takes the concealment for objects.
"""

from __future__ import annotations

import contextlib
import hashlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.ingest import take_in_background
from support.truth import SAMPLE
from support.videos import write_damaged_packets_copy
from support.waiting import wait_until

from vdet.core.types import SourceState, VideoFrame
from vdet.ingest.mailbox import FrameMailbox
from vdet.ingest.reader import DamagedFrame, SourceReader
from vdet.ingest.source_thread import IngestOptions, SourceThread


@pytest.fixture(scope="module")
def damaged_clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("damaged") / "damaged.mp4"
    write_damaged_packets_copy(SAMPLE, path)
    return path


def _frames(path: Path, *, passed: bool = False) -> tuple[dict[float, bytes], int]:
    """Digests of the decoded frames by pts, and the number of damaged-frame reports."""
    frames: dict[float, bytes] = {}
    reports = 0
    with SourceReader(str(path), pass_damaged_frames=passed) as reader:
        reader.open()
        for item in reader.frames():
            if isinstance(item, VideoFrame):
                assert item.pts_seconds is not None
                frames[item.pts_seconds] = hashlib.sha1(item.image_bgr.tobytes()).digest()
            elif isinstance(item, DamagedFrame):
                reports += 1
    return frames, reports


def test_no_frame_of_a_damaged_chain_is_handed_on(damaged_clip: Path) -> None:
    clean, _ = _frames(SAMPLE)
    kept, dropped = _frames(damaged_clip)
    passed, reported = _frames(damaged_clip, passed=True)
    # Every frame handed on is bit for bit the clean clip's frame at that time: its
    # detections are the clean clip's. The rest were counted, not lost silently.
    assert all(clean[pts] == digest for pts, digest in kept.items())
    assert dropped == reported >= 60
    assert len(kept) + dropped == len(passed)
    # Frames come back at the first keyframe after each damage: most of the clip survives.
    assert len(kept) > 0.6 * len(clean)
    # Passed on, damaged frames differ from the clean ones: what the default keeps away.
    assert sum(clean.get(pts) != digest for pts, digest in passed.items()) >= dropped // 2


@contextlib.contextmanager
def _run_worker(url: str, options: IngestOptions) -> Iterator[SourceThread]:
    worker = SourceThread("cam", url, FrameMailbox(), options)
    worker.start()
    take_in_background(worker.mailbox)  # a file not paced waits for its frames to be taken
    try:
        yield worker
    finally:
        worker.stop()


def test_worker_counts_shows_and_clears_damage(damaged_clip: Path) -> None:
    options = IngestOptions(realtime=False, loop_files=False)
    seen_errors: list[str] = []
    with _run_worker(str(damaged_clip), options) as worker:

        def watch() -> bool:
            status = worker.status()
            if status.last_error:
                seen_errors.append(status.last_error)
            return status.state is SourceState.STOPPED

        wait_until(watch, 30, interval=0.005, what="the clip to end")
        status = worker.status()
    assert status.frames_damaged >= 60
    assert status.decode_errors >= 1  # one garbled packet is refused outright
    assert status.frames_decoded < 300 - 60
    # Each damaged chain was reported with its time, then cleared at the next keyframe ...
    assert any("damaged frames" in e for e in status.recent_errors)
    assert all(e.split(" ", 1)[0].replace(".", "").isdigit() for e in status.recent_errors)
    # ... so the clean end of the clip left no current error.
    assert status.last_error is None


def test_a_file_that_is_not_video_ends_failed_not_retried(tmp_path: Path) -> None:
    text = tmp_path / "notes.nfo"
    text.write_text("not a video\n" * 10)
    options = IngestOptions(backoff_initial_s=0.05, backoff_max_s=0.05)
    with _run_worker(str(text), options) as worker:
        wait_until(lambda: not worker.is_alive(), 10, what="the worker to give up")
        status = worker.status()
    assert status.state is SourceState.FAILED
    assert status.attempts == 1
    assert "cannot open the file" in (status.last_error or "")


@pytest.fixture
def silent_camera() -> Iterator[int]:
    """A TCP port that accepts connections and never says anything."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            accepted.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(2)
        for conn in accepted:
            conn.close()
        server.close()


def test_a_camera_that_never_answers_is_a_timeout(silent_camera: int) -> None:
    options = IngestOptions(
        connect_timeout_s=0.5, read_timeout_s=0.5, backoff_initial_s=30, backoff_max_s=30
    )
    with _run_worker(f"rtsp://127.0.0.1:{silent_camera}/s", options) as worker:
        wait_until(lambda: worker.status().last_error, 10, what="the first attempt to fail")
        error = worker.status().last_error or ""
    assert "timed out" in error, error


def test_fps_is_measured_beside_the_nominal_rate(h264_clip: Path) -> None:
    options = IngestOptions(realtime=True, loop_files=True)
    with _run_worker(str(h264_clip), options) as worker:
        wait_until(lambda: worker.status().frames_decoded >= 45, 10, what="1.5 s of frames")
        status = worker.status()
    assert status.fps_nominal == pytest.approx(30.0)
    assert status.fps is not None and 20.0 < status.fps < 40.0
