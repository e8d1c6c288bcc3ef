"""NVDEC ingest without a GPU: colour selection, Annex B handling, session logic and the readers,
with PyNvVideoCodec replaced by tests/support/fake_nvc.py (FFmpeg's decoder behind the same API).

The fake decodes for real, so the frames the readers hand on are checked against the hashes in
tests/support/media/reference.json, which the GPU tests hold NVDEC to as well.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import time
from pathlib import Path
from typing import Any

import av
import av.bitstream
import numpy as np
import pytest
import torch
from support.fake_nvc import FakeNvc
from support.tools import REPO

from vdet.core.types import ColourMatrix, ColourRange, VideoFrame
from vdet.ingest.bitstream import is_length_prefixed, nal_type, nal_units, sequence_header
from vdet.ingest.nvdec import (
    GpuVideoFrame,
    NvdecDecoder,
    NvdecError,
    colour_from_metadata,
    decode_file,
    detect_b_frames,
    nvdec_available,
)
from vdet.ingest.nvdec_reader import NvdecSourceReader, select_reader
from vdet.ingest.reader import DecodeError, SourceError, SourceReader

ROOT = REPO
DATA = ROOT / "tests" / "support" / "media"
SAMPLE = ROOT / "service" / "vdet" / "assets" / "sample.mp4"
REFERENCE = json.loads((DATA / "reference.json").read_text())


def _hashes(nv12: torch.Tensor, height: int) -> dict[str, Any]:
    planes = nv12.cpu().numpy()
    return {
        "size": [int(planes.shape[1]), height],
        "y": hashlib.sha256(np.ascontiguousarray(planes[:height]).tobytes()).hexdigest(),
        "uv": hashlib.sha256(np.ascontiguousarray(planes[height:]).tobytes()).hexdigest(),
    }


def _switch_units() -> list[bytes]:
    data = (DATA / "switch.h264").read_bytes()
    units, offset = [], 0
    for size in REFERENCE["switch.h264"]["packets"]:
        units.append(data[offset : offset + size])
        offset += size
    return units


def _annexb_packets(path: Path) -> list[tuple[bytes, int, bool]]:
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        bsf = av.bitstream.BitStreamFilterContext(
            f"{stream.codec_context.name}_mp4toannexb", stream
        )
        out = []
        for packet in container.demux(stream):
            if packet.size:
                out += [(bytes(u), int(u.pts), bool(u.is_keyframe)) for u in bsf.filter(packet)]
        return out


# ------------------------------------------------------------------------------- colour


@pytest.mark.parametrize(
    ("colorspace", "color_range", "pix_fmt", "expected"),
    [
        (1, 1, "yuv420p", (ColourMatrix.BT709, ColourRange.LIMITED)),
        (7, 1, "yuv420p", (ColourMatrix.BT709, ColourRange.LIMITED)),  # SMPTE 240M
        (5, 1, "yuv420p", (ColourMatrix.BT601, ColourRange.LIMITED)),  # BT470BG
        (6, 2, "yuv420p", (ColourMatrix.BT601, ColourRange.FULL)),  # SMPTE170M, JPEG range
        (2, 0, "yuvj420p", (ColourMatrix.BT601, ColourRange.FULL)),  # unspecified, yuvj
        (9, 1, "yuv420p", (ColourMatrix.BT709, ColourRange.LIMITED)),  # BT.2020 -> nearest
        (None, None, None, (ColourMatrix.BT601, ColourRange.LIMITED)),  # as swscale does
    ],
)
def test_colour_from_metadata(
    colorspace: int | None,
    color_range: int | None,
    pix_fmt: str | None,
    expected: tuple[ColourMatrix, ColourRange],
) -> None:
    assert colour_from_metadata(colorspace, color_range, pix_fmt) == expected


def test_colour_of_real_streams(h264_clip: Path) -> None:
    for path, expected in [
        (SAMPLE, (ColourMatrix.BT709, ColourRange.LIMITED)),  # tagged BT.709, tv range
        (h264_clip, (ColourMatrix.BT601, ColourRange.LIMITED)),  # untagged
    ]:
        with av.open(str(path)) as container:
            c = container.streams.video[0].codec_context
            assert colour_from_metadata(c.colorspace, c.color_range, c.pix_fmt) == expected


# ------------------------------------------------------------------------------ annex B


def test_annexb_parameter_sets() -> None:
    first = _switch_units()[0]
    kinds = [nal_type(unit, "h264") for unit in nal_units(first)]
    assert kinds[:2] == [7, 8] and 5 in kinds  # SPS, PPS, ..., IDR slice
    assert sequence_header(first, "h264") == next(nal_units(first))
    assert sequence_header(_switch_units()[1], "h264") is None
    hevc = _annexb_packets(DATA / "hevc.mp4")[0][0]
    assert [nal_type(u, "hevc") for u in nal_units(hevc)][:3] == [32, 33, 34]  # VPS SPS PPS
    assert sequence_header(hevc, "hevc") is not None
    with av.open(str(SAMPLE)) as container:
        assert is_length_prefixed(bytes(container.streams.video[0].codec_context.extradata))
    assert not is_length_prefixed(first) and not is_length_prefixed(None)


def test_the_parameter_set_scan_ends_at_the_first_slice() -> None:
    sc = b"\x00\x00\x00\x01"
    sps, pps, sei = b"\x67\x42\x00\x1f", b"\x68\xce\x38\x80", b"\x06\x05\x01\x00"
    idr, p_slice = b"\x65\x88\x84\x00", b"\x41\x9a\x02\x00"
    assert sequence_header(sc + sei + sc + sps + sc + pps + sc + idr, "h264") == sps
    assert sequence_header(sc + p_slice + sc + sps, "h264") is None  # the next unit's SPS
    assert sequence_header(sc + p_slice, "h264") is None
    hevc_trail, hevc_sps = b"\x02\x01\xd0\x00", b"\x42\x01\x01\x01"  # TRAIL_R, SPS
    assert sequence_header(sc + hevc_sps + sc + hevc_trail, "hevc") == hevc_sps
    assert sequence_header(sc + hevc_trail + sc + hevc_sps, "hevc") is None


def test_detect_b_frames() -> None:
    assert detect_b_frames([0, 512, 2048, 1024, 1536])
    assert not detect_b_frames([0, 1, 2, 3]) and not detect_b_frames([])


# ------------------------------------------------------------------------- NvdecDecoder


def test_new_sps_starts_a_new_session_at_its_own_size() -> None:
    nvc = FakeNvc()
    decoder = NvdecDecoder("h264", nvc=nvc, device="cpu")  # type: ignore[arg-type]
    frames = []
    for i, unit in enumerate(_switch_units()):
        frames += decoder.decode(unit, pts=i, key=False)
    frames += decoder.flush()
    assert decoder.sessions == 2 and len(nvc.sessions) == 2
    assert [_hashes(f.nv12, f.height) for f in frames] == REFERENCE["switch.h264"]["frames"]
    assert [f.pts for f in frames] == list(range(48))
    options = nvc.sessions[0].options
    assert options["latency"] == "LOW" and options["usedevicememory"] is True
    assert options["cudacontext"] == 0 and options["cudastream"] == 0
    assert all(fed.decode_flag == 1 for s in nvc.sessions for fed in s.fed)  # ENDOFPICTURE


def test_reordered_packets_switch_a_low_latency_session_to_native() -> None:
    nvc = FakeNvc()
    decoder = NvdecDecoder("h264", b_frames=False, nvc=nvc, device="cpu")  # type: ignore[arg-type]
    frames = []
    for data, pts, key in _annexb_packets(DATA / "bframes.mp4"):
        frames += decoder.decode(data, pts, key)
    frames += decoder.flush()
    assert decoder.latency == "native" and decoder.sessions == 2
    assert nvc.sessions[1].options["latency"] == "NATIVE"
    assert nvc.sessions[1].fed[0].decode_flag == 0  # no ENDOFPICTURE with reordering
    assert decoder.dropped_packets > 0  # from the first reordered packet to the next keyframe
    # Frames of the native session are in display order.
    native = frames[-(48 - decoder.dropped_packets) :]
    assert [f.pts for f in native] == sorted(f.pts for f in native)


def test_native_session_for_b_frames_decodes_every_frame_in_order() -> None:
    nvc = FakeNvc()
    decoder = NvdecDecoder("h264", b_frames=True, nvc=nvc, device="cpu")  # type: ignore[arg-type]
    frames = []
    for data, pts, key in _annexb_packets(DATA / "bframes.mp4"):
        frames += decoder.decode(data, pts, key)
    frames += decoder.flush()
    assert [_hashes(f.nv12, f.height) for f in frames] == REFERENCE["bframes.mp4"]["frames"]
    assert decoder.sessions == 1 and decoder.dropped_packets == 0


def test_decoder_failure_raises_and_resumes_at_the_next_keyframe() -> None:
    nvc = FakeNvc(fail_on=3)
    decoder = NvdecDecoder("h264", nvc=nvc, device="cpu")  # type: ignore[arg-type]
    units = _switch_units()
    decoder.decode(units[0], 0, True)
    decoder.decode(units[1], 1)
    with pytest.raises(NvdecError, match="simulated decoder failure"):
        decoder.decode(units[2], 2)
    assert decoder.decode(units[3], 3) == [] and decoder.dropped_packets == 1
    resumed = []
    for i, unit in enumerate(units[4:], start=4):
        resumed += decoder.decode(unit, i)
    # The keyframe at packet 12 (GOP 12) opened a new session, the new SPS at 24 another.
    assert decoder.sessions == 3
    assert resumed and resumed[0].pts == 12


def test_out_of_band_parameter_sets_are_fed_to_each_session() -> None:
    units = _switch_units()[:24]
    first = units[0]
    vcl = [u for u in nal_units(first) if nal_type(u, "h264") in (1, 5)]
    header = b"".join(
        b"\x00\x00\x00\x01" + u for u in nal_units(first) if nal_type(u, "h264") in (7, 8)
    )
    stripped = [b"".join(b"\x00\x00\x00\x01" + u for u in vcl), *units[1:]]
    nvc = FakeNvc()
    decoder = NvdecDecoder("h264", header=header, nvc=nvc, device="cpu")  # type: ignore[arg-type]
    frames = []
    for i, unit in enumerate(stripped):
        frames += decoder.decode(unit, i)
    frames += decoder.flush()
    assert nvc.sessions[0].fed[0].data.startswith(header)
    assert [_hashes(f.nv12, f.height) for f in frames] == REFERENCE["switch.h264"]["frames"][:24]


def test_decoder_rejects_other_codecs() -> None:
    with pytest.raises(ValueError, match="NVDEC decodes"):
        NvdecDecoder("vp9", nvc=FakeNvc(), device="cpu")  # type: ignore[arg-type]


# ------------------------------------------------------------------------------- readers


@pytest.mark.parametrize(("name", "b_frames"), [("bframes.mp4", True), ("hevc.mp4", False)])
def test_decode_file_with_the_demuxer(name: str, b_frames: bool) -> None:
    decoders: list[NvdecDecoder] = []
    frames = _decode_file_cpu(DATA / name, decoders)
    assert [_hashes(f.nv12, f.height) for f in frames] == REFERENCE[name]["frames"]
    assert [f.index for f in frames] == list(range(len(frames)))
    assert decoders[0].latency == ("native" if b_frames else "low")


def _decode_file_cpu(path: Path, decoders: list[NvdecDecoder]) -> list[GpuVideoFrame]:
    # decode_file builds its decoder for cuda:gpu; route it to the CPU for the fake.
    import vdet.ingest.nvdec as nvdec

    original = nvdec.NvdecDecoder

    class CpuDecoder(original):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["device"] = "cpu"
            super().__init__(*args, **kwargs)

    nvdec.NvdecDecoder = CpuDecoder  # type: ignore[misc]
    try:
        return list(decode_file(str(path), nvc=FakeNvc(), on_decoder=decoders.append))  # type: ignore[arg-type]
    finally:
        nvdec.NvdecDecoder = original  # type: ignore[misc]


@pytest.mark.parametrize("name", ["bframes.mp4", "hevc.mp4", "sample.mp4"])
def test_nvdec_source_reader_decodes_every_frame(name: str) -> None:
    path = SAMPLE if name == "sample.mp4" else DATA / name
    reader = NvdecSourceReader(str(path), source_id="cam", nvc=FakeNvc(), device="cpu")
    with reader:
        info = reader.open()
        items = list(reader.frames())
    frames = [f for f in items if isinstance(f, GpuVideoFrame)]
    assert len(frames) == len(items)
    assert [_hashes(f.nv12, f.height) for f in frames] == REFERENCE[name]["frames"]
    assert [f.index for f in frames] == list(range(len(frames)))
    pts = [f.pts_seconds for f in frames]
    assert all(p is not None for p in pts) and pts == sorted(pts)  # type: ignore[type-var]
    first = frames[0]
    assert first.source_id == "cam" and first.size_wh == (info.width, info.height)
    assert reader.decoder is not None
    assert reader.decoder.latency == ("native" if name == "bframes.mp4" else "low")
    if name == "sample.mp4":
        assert (first.matrix, first.colour_range) == (ColourMatrix.BT709, ColourRange.LIMITED)
    # Every packet the decoder saw was Annex B: the MP4's length prefixes were converted.
    assert all(
        fed.data.startswith((b"\x00\x00\x00\x01", b"\x00\x00\x01"))
        for fed in reader._nvc.sessions[0].fed
    )


def _looped_frames(path: Path, nvc: FakeNvc, count: int) -> tuple[NvdecSourceReader, list[Any]]:
    reader = NvdecSourceReader(str(path), loop=True, nvc=nvc, device="cpu")
    frames: list[GpuVideoFrame] = []
    with reader:
        reader.open()
        for item in reader.frames():
            assert isinstance(item, GpuVideoFrame)
            frames.append(item)
            if len(frames) == count:
                break
    return reader, frames


@pytest.mark.parametrize("keep", [True, False])
def test_nvdec_source_reader_loops_a_low_latency_clip_in_one_session(
    keep: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without reordering nothing is held in the session at the end of a pass: it goes on into
    # the next pass (the class switch restores a session per pass, for the benchmark).
    monkeypatch.setattr(NvdecDecoder, "keep_session_across_passes", keep)
    nvc = FakeNvc()
    reader, frames = _looped_frames(DATA / "hevc.mp4", nvc, 60)
    assert reader.loops_completed == 2 and len(nvc.sessions) == (1 if keep else 3)
    assert reader.decoder is not None and reader.decoder.sessions == len(nvc.sessions)
    pts = [f.pts_seconds for f in frames]
    assert pts == sorted(pts)  # type: ignore[type-var]
    assert [_hashes(f.nv12, f.height) for f in frames[24:48]] == REFERENCE["hevc.mp4"]["frames"]


def test_nvdec_source_reader_loops_a_reordered_clip_with_a_new_session_per_pass() -> None:
    # NATIVE latency holds frames back for display order: each pass is drained and ended.
    nvc = FakeNvc()
    reader, frames = _looped_frames(DATA / "bframes.mp4", nvc, 110)
    assert reader.loops_completed == 2 and len(nvc.sessions) == 3
    assert [_hashes(f.nv12, f.height) for f in frames[48:96]] == REFERENCE["bframes.mp4"]["frames"]


def test_nvdec_source_reader_reports_decoder_failures_as_decode_errors() -> None:
    reader = NvdecSourceReader(str(DATA / "hevc.mp4"), nvc=FakeNvc(fail_on=5), device="cpu")
    with reader:
        reader.open()
        items = list(reader.frames())
    errors = [i for i in items if isinstance(i, DecodeError)]
    assert len(errors) == 1 and "NvdecError" in errors[0].message and reader.decode_errors == 1
    assert len(items) - 1 == 24 - 12 + 4  # frames before the failure, none until the next IDR


def test_nvdec_and_cpu_readers_give_looped_frames_the_same_indexes_and_times() -> None:
    # B-frames: the decoder returns frames later than their packets and reordered. The
    # readers share one demux/loop code path, so the two must agree exactly.
    path = str(DATA / "bframes.mp4")
    timelines = []
    for reader in (
        NvdecSourceReader(path, loop=True, nvc=FakeNvc(), device="cpu"),
        SourceReader(path, loop=True),
    ):
        frames: list[GpuVideoFrame | VideoFrame] = []
        with reader:
            reader.open()
            for item in reader.frames(first_index=3):
                assert not isinstance(item, DecodeError)
                frames.append(item)
                if len(frames) == 110:  # two passes of 48 frames and part of a third
                    break
            loops = reader.loops_completed
        timelines.append(([f.index for f in frames], [f.pts_seconds for f in frames], loops))
    assert timelines[0] == timelines[1]
    indexes, pts, loops = timelines[0]
    assert indexes == list(range(3, 113)) and loops == 2
    assert pts == pytest.approx([i / 24 for i in range(110)], abs=1e-3)


def test_nvdec_source_reader_paces_a_looped_file_in_real_time() -> None:
    reader = NvdecSourceReader(
        str(DATA / "hevc.mp4"), realtime=True, loop=True, nvc=FakeNvc(), device="cpu"
    )
    frames: list[GpuVideoFrame] = []
    with reader:
        reader.open()
        started = time.monotonic()
        for item in reader.frames():
            assert isinstance(item, GpuVideoFrame)
            frames.append(item)
            if len(frames) == 30:  # 24 frames a pass: crosses the loop
                break
        elapsed = time.monotonic() - started
    # 29 frame periods at 24 fps: 1.2 s; loose bounds, this machine may be busy.
    assert 0.6 <= elapsed <= 3.0
    arrivals = [f.arrival_time for f in frames]
    assert arrivals == sorted(arrivals)
    assert 0.6 <= arrivals[-1] - arrivals[0] <= 3.0


def test_nvdec_source_reader_stops_looping_a_file_that_decodes_no_frame(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def fail(self: NvdecDecoder, *args: Any) -> list[Any]:
        raise NvdecError("simulated decoder failure")

    monkeypatch.setattr(NvdecDecoder, "decode", fail)
    reader = NvdecSourceReader(str(DATA / "hevc.mp4"), loop=True, nvc=FakeNvc(), device="cpu")
    items: list[Any] = []
    with reader:
        reader.open()
        with pytest.raises(SourceError, match="decoded no frame"):
            items.extend(reader.frames())
    assert len(items) == 24 and all(isinstance(i, DecodeError) for i in items)
    assert [i.consecutive for i in items] == list(range(1, 25)) and reader.loops_completed == 0


def test_nvdec_source_reader_decodes_other_codecs_on_the_cpu(tmp_path: Path) -> None:
    path = tmp_path / "clip.mkv"
    with av.open(str(path), "w") as container:
        stream = container.add_stream("mpeg4", rate=10)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for i in range(5):
            image = np.full((48, 64, 3), 20 * i, np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="bgr24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    reader = NvdecSourceReader(str(path), nvc=FakeNvc(), device="cpu")
    with reader:
        reader.open()
        items = list(reader.frames())
    assert reader.on_cpu and len(items) == 5 and all(isinstance(i, VideoFrame) for i in items)
    strict = NvdecSourceReader(str(path), strict=True, nvc=FakeNvc(), device="cpu")
    refusal = r"but mpeg4 4:2:0 8-bit \d+x\d+: the NVDEC path takes H.264 and HEVC"
    with strict, pytest.raises(Exception, match=refusal):
        strict.open()


def test_select_reader_without_nvdec() -> None:
    assert not nvdec_available()  # no PyNvVideoCodec / GPU on this machine
    url = str(SAMPLE)
    assert type(select_reader(url, decoder="cpu")) is SourceReader
    assert type(select_reader(url, decoder="auto", realtime=True)) is SourceReader
    with pytest.raises(RuntimeError, match="NVDEC is not available"):
        select_reader(url, decoder="nvdec")
    with pytest.raises(ValueError, match="decoder must be one of"):
        select_reader(url, decoder="gpu")


def test_gpu_test_data_matches_pyav() -> None:
    """tests/support/media/reference.json is what FFmpeg decodes the committed clips to."""
    spec = importlib.util.spec_from_file_location(
        "make_nvdec_data", ROOT / "tests" / "support" / "media" / "make_nvdec_data.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.reference_of_committed(DATA) == REFERENCE
