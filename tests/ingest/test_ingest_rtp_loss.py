"""RTP packets lost on the way from an RTSP camera, inside pictures as well as whole ones: the
CPU path sees them through FFmpeg's decoder (it conceals the holes and flags the frame), the
NVDEC path through the relay that reads the RTP sequence numbers (vdet.ingest.rtsp_relay).
Either way no frame of a damaged chain is handed on.

The camera is GStreamer's RTSP server (tests/support/rtsp_server.py) losing every n-th RTP
packet; the NVDEC path runs on the PyNvVideoCodec stand-in (tests/support/fake_nvc.py), whose
frames are FFmpeg's decode, so a concealed picture it hands on would differ from the clip's.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import av
import numpy as np
import pytest
from support.fake_nvc import FakeNvc
from support.redirecting import rtsp_redirector
from support.rtsp import RtspServerFactory

from vdet.ingest.nvdec_reader import NvdecSourceReader
from vdet.ingest.reader import DamagedFrame, DecodeError, SourceReader
from vdet.ingest.rtsp_relay import RtpLoss, RtspRelay, _Sequence
from vdet.ingest.urls import SourcePolicy

LOSSY = (61, 40)  # every 61st RTP packet of a session after its first 40


def _clean_frames(clip: Path, fmt: str) -> list[np.ndarray]:
    with av.open(str(clip)) as container:
        return [f.to_ndarray(format=fmt) for f in container.decode(video=0)]


def _read(reader: SourceReader, frames: int) -> Iterator[tuple[int | None, object]]:
    """(clip frame index, frame) for each frame handed on, (None, reason) for each damaged,
    for `frames` items of the looped 30 fps clip."""
    with reader:
        reader.open()
        for seen, item in enumerate(reader.frames()):
            if seen >= frames:
                return
            if isinstance(item, DamagedFrame):
                yield None, item.message.split(": ", 1)[1].split(";")[0]
            elif isinstance(item, DecodeError):
                raise AssertionError(item.message)
            else:
                assert item.pts_seconds is not None
                yield round(item.pts_seconds * 30), item


def test_the_cpu_path_drops_what_the_decoder_concealed(
    rtsp_server_factory: RtspServerFactory, h264_clip: Path
) -> None:
    """FFmpeg's RTP layer over TCP checks no sequence numbers; its decoder conceals the holes
    and flags the frame: every frame the CPU path hands on is the clip's own, pixel for
    pixel."""
    clean = _clean_frames(h264_clip, "bgr24")
    camera = rtsp_server_factory(h264_clip, drop_rtp=LOSSY)
    reasons: set[str] = set()
    kept = 0
    for index, item in _read(SourceReader(camera.url), 240):  # 8 s of the looped clip
        if index is None:
            reasons.add(str(item))
            continue
        assert np.array_equal(item.image_bgr, clean[index % len(clean)]), index  # type: ignore[attr-defined]
        kept += 1
    assert kept >= 40 and "the decoder flagged the frame corrupt" in reasons, (kept, reasons)


@pytest.mark.parametrize("watch", [True, False])
def test_the_nvdec_path_drops_what_the_rtp_sequence_lost(
    rtsp_server_factory: RtspServerFactory, h264_clip: Path, watch: bool
) -> None:
    """NVDEC flags nothing it concealed; the relay's sequence gaps damage the picture they
    fell in (found by its RTP time, the packet's pts) up to the next keyframe: every frame
    handed on is the clip's own. Without the relay (watch_rtp off) concealed pictures go on,
    as they did before it."""
    clean = _clean_frames(h264_clip, "nv12")
    camera = rtsp_server_factory(h264_clip, drop_rtp=LOSSY)
    reader = NvdecSourceReader(camera.url, nvc=FakeNvc(), device="cpu")
    reader.watch_rtp = watch
    reasons: set[str] = set()
    kept = wrong = 0
    for index, item in _read(reader, 240):
        if index is None:
            reasons.add(str(item))
            continue
        nv12 = item.nv12.cpu().numpy()  # type: ignore[attr-defined]
        wrong += not np.array_equal(nv12, clean[index % len(clean)])
        kept += 1
    if watch:
        assert kept >= 60 and wrong == 0, (kept, wrong, reasons)
        assert any("RTP packet(s) missing from the camera's sequence" in r for r in reasons)
    else:
        assert wrong > 0  # what the watch is for


def test_sequence_gaps_name_the_first_picture_they_can_damage() -> None:
    seq = _Sequence(65534, 2**32 - 3000, marker=False)  # about to wrap both
    assert seq.next(65535, 2**32 - 3000, True) is None  # the end of picture 0
    # Picture 1 (3000 ticks on, across the 32-bit wrap) lost its first packet: it is the one.
    assert seq.next(1, 0, False) == RtpLoss(3000, 1)
    # A loss after a packet without the marker: the picture that packet was in lost its end.
    assert seq.next(3, 0, True) == RtpLoss(3000, 1)
    assert seq.next(3, 0, False) is None  # a duplicate (older) is not counted
    assert seq.next(4, 3000, True) is None
    assert seq.ticks == 6000


def _serve_once(payload: bytes) -> tuple[socket.socket, int]:
    listener = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(payload)
        listener.close()

    threading.Thread(target=answer, daemon=True).start()
    return listener, listener.getsockname()[1]


def _port(relay: RtspRelay) -> int:
    port = urlsplit(relay.local_url).port
    assert port is not None
    return port


def _interleaved(channel: int, seq: int, timestamp: int, marker: bool, size: int = 200) -> bytes:
    header = bytes([0x80, (0x80 if marker else 0) | 96]) + seq.to_bytes(2, "big")
    rtp = header + timestamp.to_bytes(4, "big") + b"\x00\x00\x00\x01" + bytes(size)
    return b"$" + bytes([channel]) + len(rtp).to_bytes(2, "big") + rtp


def test_the_relay_reads_gaps_through_split_reads_and_passes_every_byte() -> None:
    answer = b"RTSP/1.0 200 OK\r\nCSeq: 1\r\nContent-Length: 4\r\n\r\nv=0\n"
    frames = [
        _interleaved(0, 10, 0, True),
        _interleaved(1, 99, 0, False),  # RTCP's channel: not counted
        _interleaved(0, 11, 3000, False, size=3),  # shorter than a read
        _interleaved(0, 14, 3000, True),  # 12 and 13 lost inside picture 3000
        _interleaved(0, 15, 6000, True),
    ]
    payload = answer + b"".join(frames)
    _, port = _serve_once(payload)
    relay = RtspRelay(f"rtsp://127.0.0.1:{port}/cam", 2.0, watch_rtp=True)
    got = bytearray()
    with socket.create_connection(("127.0.0.1", _port(relay))) as ffmpeg:
        ffmpeg.sendall(b"OPTIONS rtsp://x RTSP/1.0\r\nCSeq: 1\r\n\r\n")
        while data := ffmpeg.recv(7):  # FFmpeg's reads, of any size
            got += data
    relay.close()
    assert bytes(got) == payload
    assert relay.take_losses() == [RtpLoss(3000, 2)] and relay.packets_lost == 2
    assert relay.take_losses() == []


def test_hostile_frames_cost_nothing_and_end_the_connection_cleanly() -> None:
    """A head that never ends, a `$` frame claiming 64 KiB and bytes that are no RTP."""
    noise = np.random.default_rng(3).integers(0, 256, 20_000, dtype=np.uint8).tobytes()
    for payload in (b"RTSP/1.0 200 OK\r\n" + b"x" * 70_000, b"$\x00\xff\xff" + noise, noise):
        _, port = _serve_once(payload)
        relay = RtspRelay(f"rtsp://127.0.0.1:{port}/cam", 2.0, watch_rtp=True)
        with socket.create_connection(("127.0.0.1", _port(relay)), timeout=5) as ffmpeg:
            ffmpeg.sendall(b"OPTIONS rtsp://x RTSP/1.0\r\nCSeq: 1\r\n\r\n")
            while ffmpeg.recv(65536):
                pass
        relay.close()
        assert all(loss.packets < 0x8000 for loss in relay.take_losses())


def test_a_redirected_camera_is_watched_through_a_new_relay(
    rtsp_server_factory: RtspServerFactory, h264_clip: Path
) -> None:
    """A camera behind an RTSP redirect, read by the NVDEC path under a policy that allows
    every host: vdet follows the redirect itself, so the camera it lands on is read through
    a relay too and its losses are seen."""
    camera = rtsp_server_factory(h264_clip, drop_rtp=LOSSY)
    url = rtsp_redirector("127.0.0.1", camera.url)
    reader = NvdecSourceReader(url, nvc=FakeNvc(), device="cpu", policy=SourcePolicy())
    reasons = {str(item) for index, item in _read(reader, 150) if index is None}
    assert any("RTP packet(s) missing from the camera's sequence" in r for r in reasons), reasons
