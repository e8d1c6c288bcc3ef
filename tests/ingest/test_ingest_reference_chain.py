"""Lost H.264 reference pictures found from frame_num (vdet.ingest.reference_chain), on both
decoder paths: whole frames missing from a stream whose container is intact (the case no
demuxer flags), a lost non-reference picture that damages nothing, and hostile bytes.

The NVDEC path runs on the PyNvVideoCodec stand-in (tests/support/fake_nvc.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
from support.fake_nvc import FakeNvc
from support.truth import SAMPLE

from vdet.ingest.nvdec_reader import NvdecSourceReader
from vdet.ingest.reader import DamagedFrame, DecodeError, SourceReader
from vdet.ingest.reference_chain import ReferenceChain, parse_sps
from vdet.modelkit.dataset.media_cases import drop_frames, reencode

# The sample clip: 300 frames, a keyframe every 30, every picture a reference (IPPP).
KEYFRAMES = range(0, 300, 30)


def _packets(path: Path) -> tuple[list[bytes], bytes]:
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        extradata = bytes(stream.codec_context.extradata or b"")
        return [bytes(p) for p in container.demux(stream) if p.size], extradata


def _gaps(path: Path) -> list[int]:
    """The packets (decode order) the chain finds after lost references."""
    packets, extradata = _packets(path)
    chain = ReferenceChain()
    if extradata[:1] == b"\x01":
        found = [chain.feed_length_prefixed(p, extradata) for p in packets]
    else:
        found = [chain.feed_annex_b(p) for p in packets]
    return [i for i, reason in enumerate(found) if reason is not None]


def test_the_sample_sps_parses() -> None:
    _, extradata = _packets(SAMPLE)
    sps_length = int.from_bytes(extradata[6:8], "big")
    sps = parse_sps(extradata[8 + 1 : 8 + sps_length])
    assert sps is not None and 4 <= sps.log2_max_frame_num <= 16
    assert not sps.gaps_allowed and not sps.separate_colour_plane


@pytest.mark.parametrize("container_format", ["mp4", "mpegts"])
def test_an_intact_stream_has_no_gap_and_lost_pictures_are_found(
    tmp_path: Path, container_format: str
) -> None:
    suffix = {"mp4": "mp4", "mpegts": "ts"}[container_format]
    whole = drop_frames(SAMPLE, tmp_path / f"whole.{suffix}", set(), container_format)
    assert _gaps(whole) == []
    cut = drop_frames(SAMPLE, tmp_path / f"cut.{suffix}", {40, 41, 100}, container_format)
    # Packets 40, 41 and 100 are gone: the next pictures (42 -> index 40, 101 -> 98) follow
    # the gap; a keyframe lost is not asked for (the cut is inside a GOP).
    assert _gaps(cut) == [40, 98]


def test_a_lost_non_reference_picture_damages_nothing(tmp_path: Path) -> None:
    """B-frames that are not references (x264 without B-pyramid): losing one is no gap;
    losing a P-frame is."""
    clip = reencode(
        SAMPLE, tmp_path / "b.mp4", "libx264", "yuv420p", frames=60,
        options={"x264-params": "bframes=2:b-adapt=0:b-pyramid=none:keyint=60:log-level=error"},
    )  # fmt: skip
    with av.open(str(clip)) as container:
        stream = container.streams.video[0]
        kinds = [
            "I" if p.is_keyframe else "?" for p in container.demux(stream) if p.size
        ]  # decode order
    packets, extradata = _packets(clip)
    nal_ref = [_first_slice_ref_idc(p, extradata) for p in packets]
    non_ref = [i for i, ref in enumerate(nal_ref) if ref == 0]
    ref = [i for i, r in enumerate(nal_ref) if r and kinds[i] != "I" and i > 2]
    assert non_ref and ref
    assert _gaps(drop_frames(clip, tmp_path / "no-b.mp4", {non_ref[3]})) == []
    assert _gaps(drop_frames(clip, tmp_path / "no-p.mp4", {ref[3]})) != []


def _first_slice_ref_idc(packet: bytes, extradata: bytes) -> int:
    size = (extradata[4] & 3) + 1
    at = 0
    while at + size <= len(packet):
        length = int.from_bytes(packet[at : at + size], "big")
        kind = packet[at + size] & 0x1F
        if kind in (1, 5):
            return (packet[at + size] >> 5) & 3
        at += size + length
    raise AssertionError("no slice")


def test_hostile_bytes_never_raise() -> None:
    rng = np.random.default_rng(5)
    chain = ReferenceChain()
    for _ in range(2000):
        size = int(rng.integers(0, 64))
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        chain.feed_annex_b(b"\x00\x00\x01" + data)
        chain.feed_annex_b(b"\x00\x00\x01\x67" + data)  # an SPS of noise
        chain.feed_annex_b(b"\x00\x00\x01\x68" + data)  # a PPS of noise
        chain.feed_length_prefixed(data, b"\x01" + data)
    # A run of zero bits is no exp-Golomb code at all.
    assert parse_sps(b"\x42\x00\x1e" + b"\x00" * 40) is None
    assert chain.feed_annex_b(b"\x00\x00\x01") is None


def _read(reader: SourceReader) -> tuple[int, int, int, list[str]]:
    frames = damaged = errors = 0
    reasons: list[str] = []
    with reader:
        reader.open()
        for item in reader.frames():
            if isinstance(item, DamagedFrame):
                damaged += 1
                reasons.append(item.message)
            elif isinstance(item, DecodeError):
                errors += 1
            else:
                frames += 1
    return frames, damaged, errors, reasons


@pytest.mark.parametrize("path", ["cpu", "nvdec"])
def test_both_decoders_drop_the_frames_after_lost_pictures(tmp_path: Path, path: str) -> None:
    """Frames 40, 41 and 100 lost from an MPEG-TS whose transport is intact: the pictures
    after each loss up to the next keyframe (42-59, 101-119: 37) are reported damaged and
    dropped on both paths (the CPU path's frame threads hold 2 more back, marked with them),
    with the reason; passed when damaged frames are."""
    cut = drop_frames(SAMPLE, tmp_path / "cut.ts", {40, 41, 100}, "mpegts")

    def reader() -> SourceReader:
        if path == "nvdec":
            return NvdecSourceReader(str(cut), nvc=FakeNvc(), device="cpu")
        return SourceReader(str(cut))

    frames, damaged, errors, reasons = _read(reader())
    assert errors == 0 and frames + damaged == 297
    assert damaged == (37 if path == "nvdec" else 39)
    assert "reference pictures are missing from the stream (H.264 frame_num" in reasons[0]
    passing = reader()
    passing.pass_damaged_frames = True
    frames, reported, _, _ = _read(passing)
    assert frames == 297 and reported == damaged


def test_a_looped_file_starts_each_pass_afresh(tmp_path: Path) -> None:
    """Looping back to the first keyframe is no gap (the chain restarts each pass)."""
    reader = SourceReader(str(SAMPLE), loop=True)
    seen = damaged = 0
    with reader:
        reader.open()
        for item in reader.frames():
            damaged += isinstance(item, DamagedFrame)
            seen += 1
            if seen >= 650:
                break
    assert damaged == 0


@pytest.mark.parametrize("path", ["cpu", "nvdec"])
def test_frames_lost_on_an_rtsp_camera_are_found(
    rtsp_server_factory: Any, h264_clip: Path, tmp_path: Path, path: str
) -> None:
    """A real RTSP camera (GStreamer's server) whose stream lacks frames 40 and 41 (as when a
    link loses every RTP packet of two pictures; the RTP itself is intact, so nothing in
    FFmpeg's RTSP demuxer says so): both decoders report the pictures after the loss up to
    the next keyframe (frame 60, 1 s GOPs) as damaged, with the frame_num reason."""
    cut = drop_frames(h264_clip, tmp_path / "cut.mp4", {40, 41})
    camera = rtsp_server_factory(cut)
    reader: SourceReader = (
        NvdecSourceReader(camera.url, nvc=FakeNvc(), device="cpu")
        if path == "nvdec"
        else SourceReader(camera.url)
    )
    damaged: list[str] = []
    seen = 0
    with reader:
        reader.open()
        for item in reader.frames():
            seen += 1
            if isinstance(item, DamagedFrame):
                damaged.append(item.message)
            if seen >= 75:  # 2.5 s of the looped clip: past the loss and its keyframe
                break
    assert 17 <= len(damaged) <= 21, damaged
    assert all("H.264 frame_num" in message for message in damaged)
