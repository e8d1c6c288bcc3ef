"""NVDEC decode on the GPU, held to FFmpeg's output bit for bit (H.264 / HEVC decoding is exact).

Needs a CUDA GPU and PyNvVideoCodec (skipped otherwise); not PyAV: files are demuxed by
PyNvVideoCodec's own `CreateDemuxer(filename=...)`, and the expected planes are the SHA-256
hashes in tests/support/media/reference.json, made with PyAV by
tests/support/media/make_nvdec_data.py (a CPU test checks them against the committed clips).

Facts these tests rely on, as found on the GPU machine on 2026-12-02 (one H200, driver 580.159.04,
CUDA 13.0, torch 2.11.0+cu130, PyNvVideoCodec 2.2.4):
- libnvcuvid.so lives in /usr/local/nvidia/lib64, which must be on LD_LIBRARY_PATH.
- A 1080p H.264 IPPP clip decodes 300/300 frames with DisplayDecodeLatencyType.LOW and the
  ENDOFPICTURE flag; a clip with B-frames decodes completely in NATIVE mode.
- `torch.from_dlpack(frame)` of a decoded 1080p frame is a (1620, 1920) uint8 CUDA tensor:
  Y rows, then interleaved UV rows.
- `GetDecoderCaps` for H.264 reports 7 decoder engines on the H200.
Warnings are reported, not raised, here: this suite runs only where a GPU is, seldom.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from typing import Any

import numpy as np
import pytest
from support.tools import REPO

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
with warnings.catch_warnings():  # whatever its import warns about must not stop collection
    warnings.simplefilter("ignore")
    pytest.importorskip("PyNvVideoCodec")

from vdet.core.types import ColourMatrix, ColourRange  # noqa: E402
from vdet.ingest.nvdec import (  # noqa: E402
    GpuVideoFrame,
    NvdecDecoder,
    colour_from_demuxer,
    decode_file,
    load_pynvvideocodec,
    nvdec_available,
    packet_bytes,
)

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("always")]

ROOT = REPO
DATA = ROOT / "tests" / "support" / "media"
SAMPLE = ROOT / "service" / "vdet" / "assets" / "sample.mp4"
REFERENCE = json.loads((DATA / "reference.json").read_text())


def _hashes(nv12: Any, height: int) -> dict[str, Any]:
    planes = nv12.cpu().numpy()
    return {
        "size": [int(planes.shape[1]), height],
        "y": hashlib.sha256(np.ascontiguousarray(planes[:height]).tobytes()).hexdigest(),
        "uv": hashlib.sha256(np.ascontiguousarray(planes[height:]).tobytes()).hexdigest(),
    }


def _frame_hashes(frame: GpuVideoFrame) -> dict[str, Any]:
    frame.wait(torch.cuda.current_stream())
    return _hashes(frame.nv12, frame.height)


def _mismatches(got: list[dict[str, Any]], expected: list[dict[str, Any]]) -> list[int]:
    return [i for i, (g, e) in enumerate(zip(got, expected, strict=False)) if g != e]


def _switch_units() -> list[bytes]:
    data = (DATA / "switch.h264").read_bytes()
    units, offset = [], 0
    for size in REFERENCE["switch.h264"]["packets"]:
        units.append(data[offset : offset + size])
        offset += size
    return units


def test_nvdec_is_available() -> None:
    assert nvdec_available(0, "h264")
    assert nvdec_available(0, "hevc")
    assert not nvdec_available(0, "vp9")  # not on the NVDEC path here (CPU decodes it)


def test_sample_clip_every_frame_bit_exact_in_low_latency() -> None:
    decoders: list[NvdecDecoder] = []
    got = []
    for frame in decode_file(str(SAMPLE), source_id="sample", on_decoder=decoders.append):
        assert frame.nv12.is_cuda and frame.size_wh == (1920, 1080)
        assert frame.ready is not None and frame.stream is not None
        got.append(_frame_hashes(frame))
    expected = REFERENCE["sample.mp4"]["frames"]
    assert len(got) == len(expected) == 300
    assert _mismatches(got, expected) == []
    assert decoders[0].latency == "low" and decoders[0].sessions == 1


def test_a_looped_clip_decodes_every_pass_bit_exact_in_one_session() -> None:
    # LOW latency holds no frame at the end of a pass, so the session carries on into the next
    # pass (what makes a looped demo or benchmark source cost one session, not one a pass).
    from vdet.ingest.nvdec_reader import NvdecSourceReader

    reader = NvdecSourceReader(str(SAMPLE), loop=True, strict=True)
    got, pts = [], []
    with reader:
        reader.open()
        for frame in reader.frames():
            assert isinstance(frame, GpuVideoFrame)
            pts.append(frame.pts_seconds)
            if len(pts) > 300:  # the second pass, after the session lived through a loop
                got.append(_frame_hashes(frame))
            if len(pts) == 620:
                break
    assert reader.loops_completed == 2
    assert reader.decoder is not None and reader.decoder.sessions == 1
    assert np.allclose(np.diff(np.asarray(pts, dtype=float)), 1 / 30, atol=1e-3)
    expected = REFERENCE["sample.mp4"]["frames"]
    assert len(got) == 320  # frames 300..619: all of pass 2, the start of pass 3
    assert _mismatches(got[:300], expected) == []
    assert _mismatches(got[300:], expected[:20]) == []


def test_low_latency_returns_each_frame_from_its_own_packet() -> None:
    nvc = load_pynvvideocodec()
    demuxer = nvc.CreateDemuxer(filename=str(SAMPLE))
    decoder = NvdecDecoder("h264", b_frames=False)
    same_call, total = 0, 0
    for packet in demuxer:
        data = packet_bytes(packet)
        if not data:
            continue
        frames = decoder.decode(data, int(packet.pts), bool(packet.key))
        total += len(frames)
        same_call += sum(1 for f in frames if f.pts == int(packet.pts))
    total += len(decoder.flush())
    assert total == 300
    assert same_call >= 299  # no display delay: a frame comes back with its own packet


def test_b_frames_decode_in_display_order_with_native_latency() -> None:
    decoders: list[NvdecDecoder] = []
    frames = list(decode_file(str(DATA / "bframes.mp4"), on_decoder=decoders.append))
    assert decoders[0].latency == "native"  # detected from the first packets' times
    got = [_frame_hashes(f) for f in frames]
    assert len(got) == 48 and _mismatches(got, REFERENCE["bframes.mp4"]["frames"]) == []
    pts = [f.pts_seconds for f in frames]
    assert pts == sorted(pts)


def test_hevc_clip_bit_exact() -> None:
    frames = list(decode_file(str(DATA / "hevc.mp4")))
    got = [_frame_hashes(f) for f in frames]
    assert len(got) == 24 and _mismatches(got, REFERENCE["hevc.mp4"]["frames"]) == []


def test_resolution_change_starts_a_new_session_at_the_new_size() -> None:
    decoder = NvdecDecoder("h264")
    frames = []
    for i, unit in enumerate(_switch_units()):
        frames += decoder.decode(unit, pts=i)
    frames += decoder.flush()
    assert [(f.width, f.height) for f in frames] == [(320, 240)] * 24 + [(176, 144)] * 24
    assert decoder.sessions == 2
    torch.cuda.current_stream().wait_stream(decoder.stream)
    got = [_hashes(f.nv12, f.height) for f in frames]
    assert _mismatches(got, REFERENCE["switch.h264"]["frames"]) == []


def test_frames_keep_their_pixels_after_later_decodes() -> None:
    """Each frame is copied out of the decoder's reused output pool: read them all at the end."""
    kept = []
    for frame in decode_file(str(SAMPLE)):
        kept.append(frame)
        if len(kept) == 40:
            break
    torch.cuda.synchronize()
    got = [_frame_hashes(f) for f in kept]
    assert _mismatches(got, REFERENCE["sample.mp4"]["frames"][:40]) == []


def test_a_frame_read_on_another_stream_after_wait() -> None:
    frame = next(iter(decode_file(str(SAMPLE))))
    other = torch.cuda.Stream()
    frame.wait(other)
    with torch.cuda.stream(other):
        copy = frame.nv12.clone()
    other.synchronize()
    assert _hashes(copy, frame.height) == REFERENCE["sample.mp4"]["frames"][0]


def test_colour_from_the_demuxer() -> None:
    nvc = load_pynvvideocodec()
    demuxer = nvc.CreateDemuxer(filename=str(SAMPLE))
    assert colour_from_demuxer(demuxer) == (ColourMatrix.BT709, ColourRange.LIMITED)
