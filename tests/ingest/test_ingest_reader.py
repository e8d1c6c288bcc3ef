from __future__ import annotations

import threading
import time
from pathlib import Path

import av
import numpy as np
import pytest

from vdet.core.types import VideoFrame
from vdet.ingest.reader import (
    DamagedFrame,
    DecodeError,
    SourceReader,
    StreamInfo,
    interrupt_supported,
    open_options,
)
from vdet.ingest.urls import ffmpeg_whitelists


def read_all(reader: SourceReader, limit: int | None = None) -> list[VideoFrame | DecodeError]:
    items: list[VideoFrame | DecodeError] = []
    for item in reader.frames():
        items.append(item)
        if limit is not None and len(items) >= limit:
            break
    return items


def only_frames(items: list[VideoFrame | DecodeError]) -> list[VideoFrame]:
    return [item for item in items if isinstance(item, VideoFrame)]


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "rtsp://cam/x",
            {"rtsp_transport": "tcp", "timeout": "2500000", "fflags": "nobuffer"},
        ),
        ("rtsps://cam/x", {"rtsp_transport": "tcp", "timeout": "2500000"}),
        ("http://cam/x", {"timeout": "2500000", "rw_timeout": "2500000"}),
        ("https://cam/x", {"timeout": "2500000", "rw_timeout": "2500000"}),
    ],
)
def test_network_sources_get_tcp_and_socket_timeouts(url: str, expected: dict[str, str]) -> None:
    options = open_options(url, read_timeout_s=2.5)
    assert options.items() >= expected.items()
    assert "stimeout" not in options  # gone since FFmpeg 5


def test_files_get_no_network_options_only_the_whitelists(h264_clip: Path) -> None:
    options = open_options(str(h264_clip), read_timeout_s=1.0)
    assert options == ffmpeg_whitelists(str(h264_clip))
    assert options["protocol_whitelist"] == "file"


@pytest.mark.parametrize("clip_fixture", ["h264_clip", "h264_bframes_clip"])
def test_a_file_decodes_every_frame_in_display_order(
    clip_fixture: str, request: pytest.FixtureRequest
) -> None:
    clip: Path = request.getfixturevalue(clip_fixture)
    with SourceReader(str(clip), source_id="cam") as reader:
        info = reader.open()
        before = time.time()
        frames = only_frames(read_all(reader))
    assert info == StreamInfo(width=640, height=360, fps=30.0, codec="h264", live=False)
    assert len(frames) == 120
    assert [f.index for f in frames] == list(range(120))
    pts = [f.pts_seconds for f in frames]
    assert pts == pytest.approx([i / 30 for i in range(120)], abs=1e-3)
    first = frames[0]
    assert first.source_id == "cam"
    assert first.size_wh == (640, 360)
    assert first.image_bgr.dtype == np.uint8
    assert first.image_bgr.flags.c_contiguous
    assert all(f.arrival_time >= before - 1 for f in frames)
    assert all(0 <= f.decode_seconds < 1 for f in frames)


def test_frames_are_bgr(h264_clip: Path) -> None:
    with SourceReader(str(h264_clip)) as reader:
        reader.open()
        first = only_frames(read_all(reader, limit=1))[0]
    # The red box of the clip sits at rows 90..170, columns 0..80 in frame 0.
    b, g, r = first.image_bgr[130, 40].astype(int)
    assert r > 200
    assert b < 60
    assert g < 60


def test_first_index_continues_a_count(h264_clip: Path) -> None:
    with SourceReader(str(h264_clip)) as reader:
        reader.open()
        indexes = [f.index for f in only_frames(list(reader.frames(first_index=500)))]
    assert indexes[0] == 500
    assert indexes[-1] == 619


def test_a_looped_file_keeps_counting_frames_and_time(h264_bframes_clip: Path) -> None:
    with SourceReader(str(h264_bframes_clip), loop=True) as reader:
        reader.open()
        frames = only_frames(read_all(reader, limit=300))
        assert reader.loops_completed == 2
    assert [f.index for f in frames] == list(range(300))
    pts = [f.pts_seconds for f in frames]
    assert pts == pytest.approx([i / 30 for i in range(300)], abs=1e-3)


def test_realtime_pacing_follows_the_frame_rate(h264_clip: Path) -> None:
    with SourceReader(str(h264_clip), realtime=True, loop=True) as reader:
        reader.open()
        started = time.monotonic()
        frames = only_frames(read_all(reader, limit=46))
        elapsed = time.monotonic() - started
    # 45 frame periods at 30 fps: 1.5 s; loose bounds, this machine may be busy.
    assert 0.75 <= elapsed <= 3.0
    arrivals = [f.arrival_time for f in frames]
    assert arrivals == sorted(arrivals)
    assert 0.75 <= arrivals[-1] - arrivals[0] <= 3.0


def test_a_paced_reader_more_than_a_second_behind_restarts_its_schedule(h264_clip: Path) -> None:
    with SourceReader(str(h264_clip), realtime=True, loop=True) as reader:
        reader.open()
        frames = reader.frames()
        next(frames)
        time.sleep(1.3)  # a consumer stall: the next packets are 1.3 s late
        started = time.monotonic()
        for _ in range(10):
            next(frames)
        # The backlog is not sent in a burst: 10 frames take their own ~0.3 s.
        assert time.monotonic() - started >= 0.2
        assert reader.pacing_resets == 1
        assert 1.0 < reader.pacing_lag_dropped_s < 2.5
        frames.close()


def test_without_pacing_a_file_is_read_as_fast_as_it_decodes(h264_clip: Path) -> None:
    with SourceReader(str(h264_clip)) as reader:
        reader.open()
        started = time.monotonic()
        read_all(reader)
    assert time.monotonic() - started < 4.0 / 2  # faster than real time by far


def test_a_corrupt_file_reports_decode_errors_and_keeps_decoding(corrupt_clip: Path) -> None:
    with SourceReader(str(corrupt_clip)) as reader:
        reader.open()
        items = read_all(reader)
        assert reader.decode_errors > 0
    # Frames of the damaged chains are reported as DamagedFrame, a kind of DecodeError.
    errors = [item for item in items if type(item) is DecodeError]
    frames = only_frames(items)
    assert len(errors) == reader.decode_errors
    assert errors[0].consecutive == 1
    assert all("Error" in e.message for e in errors)
    assert 10 < len(frames) < 120
    # Frames decoded after the damage still come out.
    last_error_at = max(i for i, item in enumerate(items) if type(item) is DecodeError)
    first_error_at = min(i for i, item in enumerate(items) if type(item) is DecodeError)
    # Decoding goes on between the errors: the frames in between are decoded (and dropped
    # as part of a damaged chain until a keyframe comes).
    between = items[first_error_at:last_error_at]
    assert any(isinstance(item, VideoFrame | DamagedFrame) for item in between)


def test_a_file_that_is_not_video_fails_to_open(tmp_path: Path) -> None:
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(b"\x00" * 4096)
    with SourceReader(str(junk)) as reader, pytest.raises(av.FFmpegError):
        reader.open()


def test_connection_refused_fails_fast(closed_port: int) -> None:
    started = time.monotonic()
    with (
        SourceReader(f"rtsp://127.0.0.1:{closed_port}/cam", connect_timeout_s=5) as reader,
        pytest.raises(ConnectionRefusedError),
    ):
        reader.open()
    assert time.monotonic() - started < 2.0


@pytest.mark.parametrize("scheme", ["rtsp", "http"])
def test_a_silent_peer_times_out_after_the_connect_timeout(silent_port: int, scheme: str) -> None:
    started = time.monotonic()
    with (
        SourceReader(f"{scheme}://127.0.0.1:{silent_port}/cam", connect_timeout_s=0.5) as reader,
        pytest.raises(av.FFmpegError),
    ):
        reader.open()
    assert 0.4 <= time.monotonic() - started < 3.0


@pytest.mark.parametrize("scheme", ["rtsp", "http"])
def test_interrupt_aborts_a_blocking_open_from_another_thread(
    silent_port: int, scheme: str
) -> None:
    assert interrupt_supported()
    reader = SourceReader(
        f"{scheme}://127.0.0.1:{silent_port}/cam", connect_timeout_s=60, read_timeout_s=60
    )
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            reader.open()
            outcome.append(None)
        except Exception as exc:
            outcome.append(exc)
        finally:
            reader.close()

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(0.3)
    assert thread.is_alive()
    started = time.monotonic()
    reader.interrupt()
    thread.join(5)
    assert not thread.is_alive()
    assert time.monotonic() - started < 1.5
    assert isinstance(outcome[0], av.FFmpegError)


def test_interrupt_ends_paced_frames_at_once(h264_clip: Path) -> None:
    with SourceReader(str(h264_clip), realtime=True, loop=True) as reader:
        reader.open()
        frames = reader.frames()
        next(frames)
        threading.Timer(0.2, reader.interrupt).start()
        started = time.monotonic()
        rest = list(frames)
        assert time.monotonic() - started < 1.0
        assert len(rest) < 30
