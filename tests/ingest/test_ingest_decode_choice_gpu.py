"""On the GPU: the decoder chosen by the real NVDEC caps, damaged chains dropped on NVDEC, and
streams moving between NVDEC and the CPU at a new sequence header.

The CPU tests of the same logic (tests/ingest/test_ingest_decode_choice.py) use the recorded
caps (tests/support/media/nvdec_caps.json); here the driver answers, and NVDEC decodes.
Needs a CUDA GPU, PyNvVideoCodec and PyAV (skipped otherwise).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import warnings
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
from support.fake_nvc import HOPPER_CAPS
from support.truth import SAMPLE

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    pytest.importorskip("PyNvVideoCodec")

from vdet.core.types import VideoFrame  # noqa: E402
from vdet.ingest.decode_choice import VideoFormat, choose  # noqa: E402
from vdet.ingest.nvdec import GpuVideoFrame, decoder_caps, load_pynvvideocodec  # noqa: E402
from vdet.ingest.nvdec_reader import NvdecSourceReader  # noqa: E402
from vdet.ingest.reader import DamagedFrame, DecodeError, SourceReader  # noqa: E402
from vdet.modelkit.dataset.media_cases import (  # noqa: E402
    drop_frames,
    write_format_sequence_ts,
    write_lossy_ts,
)

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("always")]


def _caps(codec: str, chroma: str, bits: int) -> dict[str, object]:
    caps = decoder_caps(0, codec, chroma, bits)
    return {} if caps is None else dataclasses.asdict(caps)


def test_the_driver_answers_as_the_recorded_caps_for_the_formats_relied_on() -> None:
    answers = {
        f"{ {'h264': 'H264', 'hevc': 'HEVC'}[codec] }/{chroma}/{bits}": _caps(codec, chroma, bits)
        for codec in ("h264", "hevc")
        for chroma in ("400", "420", "422", "444")
        for bits in (8, 10, 12)
    }
    # The GPU session script keeps them (NVDEC_CAPS_OUT) to refresh the recorded caps.
    if out := os.environ.get("NVDEC_CAPS_OUT"):
        Path(out).write_text(json.dumps(answers, indent=1, sort_keys=True) + "\n")
    for key in ("H264/420/8", "HEVC/420/8", "HEVC/420/10", "H264/420/10", "H264/422/8"):
        assert answers[key].get("supported") == bool(HOPPER_CAPS[key]["supported"]), key
    assert int(str(answers["H264/420/8"]["max_width"])) >= 4096


def _read(reader: SourceReader) -> tuple[dict[float, bytes], int, list[str]]:
    kept: dict[float, bytes] = {}
    damaged = 0
    kinds: list[str] = []
    with reader:
        reader.open()
        for item in reader.frames():
            assert not isinstance(item, DecodeError) or isinstance(item, DamagedFrame), item
            if isinstance(item, DamagedFrame):
                damaged += 1
            elif isinstance(item, GpuVideoFrame):
                item.wait(torch.cuda.current_stream())
                assert item.pts_seconds is not None
                digest = hashlib.sha1(item.nv12.cpu().numpy().tobytes()).digest()
                kept[round(item.pts_seconds, 3)] = digest
                kinds.append("gpu")
            elif isinstance(item, VideoFrame):
                kinds.append("cpu")
    return kept, damaged, kinds


def test_nvdec_hands_on_no_frame_of_a_damaged_chain(tmp_path: Path) -> None:
    assert write_lossy_ts(SAMPLE, tmp_path / "clean.ts", every=10**9) == 0
    assert write_lossy_ts(SAMPLE, tmp_path / "lossy.ts") > 20
    clean, _, _ = _read(NvdecSourceReader(str(tmp_path / "clean.ts"), strict=True))
    kept, damaged, _ = _read(NvdecSourceReader(str(tmp_path / "lossy.ts"), strict=True))
    cpu = SourceReader(str(tmp_path / "lossy.ts"))
    _, cpu_damaged, _ = _read(cpu)
    assert len(clean) == 300 and len(kept) + damaged == 300
    # Every frame NVDEC hands on is bit for bit its decode of the whole clip.
    assert all(clean[pts] == digest for pts, digest in kept.items())
    assert 0.9 * cpu_damaged <= damaged <= cpu_damaged


def test_frames_lost_on_an_rtsp_camera_are_dropped_on_nvdec(
    rtsp_server_factory: Any, h264_clip: Path, tmp_path: Path
) -> None:
    """The real RTSP camera (GStreamer's server) without pictures 40 and 41 (a link that lost
    every RTP packet of them): NVDEC hands on no picture after the loss up to the next keyframe
    (frame 60, 1 s GOPs), each reported damaged with the frame_num reason, the rest decoded on
    the GPU."""
    cut = drop_frames(h264_clip, tmp_path / "cut.mp4", {40, 41})
    camera = rtsp_server_factory(cut)
    reader = NvdecSourceReader(camera.url, strict=True)
    damaged: list[str] = []
    kinds: list[str] = []
    with reader:
        reader.open()
        for item in reader.frames():
            if isinstance(item, DamagedFrame):
                damaged.append(item.message)
            elif isinstance(item, GpuVideoFrame):
                kinds.append("gpu")
            else:
                kinds.append(type(item).__name__)
            if len(damaged) + len(kinds) >= 75:  # 2.5 s: past the loss and its keyframe
                break
    assert 17 <= len(damaged) <= 21, damaged
    assert all("H.264 frame_num" in message for message in damaged)
    assert set(kinds) == {"gpu"}


def test_rtp_packets_lost_on_an_rtsp_camera_are_dropped_on_nvdec(
    rtsp_server_factory: Any, h264_clip: Path
) -> None:
    """The real RTSP camera losing every 61st RTP packet, inside pictures as well: NVDEC
    conceals what it lacks and says nothing, so the reader's relay reads the RTP sequence
    numbers. Every frame handed on (over the clip's first pass) is bit for bit NVDEC's decode
    of the whole clip; the rest are reported with the RTP reason."""
    clean, _, _ = _read(NvdecSourceReader(str(h264_clip), strict=True))
    camera = rtsp_server_factory(h264_clip, drop_rtp=(61, 40))
    reader = NvdecSourceReader(camera.url, strict=True)
    kept = wrong = 0
    reasons: set[str] = set()
    with reader:
        reader.open()
        for item in reader.frames():
            if isinstance(item, DamagedFrame):
                reasons.add(item.message.split(": ", 1)[1].split(";")[0])
                continue
            assert isinstance(item, GpuVideoFrame), item
            assert item.pts_seconds is not None
            if item.pts_seconds >= 3.9:  # the clip's first pass (4 s) is compared
                break
            item.wait(torch.cuda.current_stream())
            digest = hashlib.sha1(item.nv12.cpu().numpy().tobytes()).digest()
            wrong += clean[round(item.pts_seconds, 3)] != digest
            kept += 1
    # A loss every ~10 pictures of 30-picture GOPs leaves the few frames between a keyframe
    # and the GOP's first loss: 15 of the first pass on an H100; the floor keeps the check
    # from passing on nothing.
    assert kept >= 10 and wrong == 0, (kept, wrong, reasons)
    assert "1 RTP packet(s) missing from the camera's sequence" in reasons, reasons


def test_a_stream_moves_to_the_cpu_and_back_at_new_sequences(tmp_path: Path) -> None:
    parts = [("libx264", "yuv420p"), ("libx264", "yuv420p10le"), ("libx264", "yuv420p")]
    path = write_format_sequence_ts(tmp_path / "switch.ts", parts)
    reader = NvdecSourceReader(str(path))
    _, damaged, kinds = _read(reader)
    assert damaged == 0
    assert kinds == ["gpu"] * 20 + ["cpu"] * 20 + ["gpu"] * 20
    assert reader.decoder_switches == 2


def test_10_bit_hevc_decodes_on_nvdec_sample_for_sample(tmp_path: Path) -> None:
    """HEVC Main10 on NVDEC: P016 surfaces whose samples, shifted down, are FFmpeg's 10-bit
    samples exactly (HEVC decoding is bit exact), read through the strides PyNvVideoCodec
    reports (printed for the record); as BGR within 3 levels of FFmpeg's own conversion with
    nearest chroma."""
    from vdet.gpu.devices import frame_to_bgr

    path = write_format_sequence_ts(tmp_path / "main10.ts", [("libx265", "yuv420p10le")])
    reader = NvdecSourceReader(str(path), strict=True)
    frames: list[GpuVideoFrame] = []
    with reader:
        reader.open()
        for item in reader.frames():
            assert isinstance(item, GpuVideoFrame), item
            frames.append(item)
    assert (reader.choice.path, reader.choice.label) == ("nvdec", "none")
    with av.open(str(path)) as container:
        reference = list(container.decode(container.streams.video[0]))
    assert len(frames) == len(reference) == 20
    for frame, want in zip(frames, reference, strict=True):
        assert frame.bits == 10 and frame.nv12.dtype == torch.uint16
        frame.wait(torch.cuda.current_stream())
        surface = frame.nv12.cpu().numpy()
        planar = want.to_ndarray()  # yuv420p10le: Y, then the U and V planes
        flat = planar.reshape(-1)
        u = flat[240 * 320 : 240 * 320 + 120 * 160].reshape(120, 160)
        v = flat[240 * 320 + 120 * 160 :].reshape(120, 160)
        assert np.array_equal(surface[:240] >> 6, planar[:240])
        assert np.array_equal(surface[240:, 0::2] >> 6, u)
        assert np.array_equal(surface[240:, 1::2] >> 6, v)
        assert not (surface & 0x3F).any()  # nothing below the 10 bits
        sws = want.reformat(format="bgr24", interpolation="POINT").to_ndarray()
        diff = np.abs(frame_to_bgr(frame).astype(int) - sws.astype(int))
        assert diff.max() <= 3 and diff.mean() < 1.0
    print("P016 DLPack strides as PyNvVideoCodec reports them:", _p016_strides(path))


def _p016_strides(path: Path) -> tuple[int, ...]:
    """The strides of the DLPack view of the first P016 frame PyNvVideoCodec returns."""
    nvc = load_pynvvideocodec()
    demuxer = nvc.CreateDemuxer(filename=str(path))
    decoder = nvc.CreateDecoder(
        gpuid=0, codec=demuxer.GetNvCodecId(), cudacontext=0, cudastream=0, usedevicememory=True
    )
    for packet in demuxer:
        for frame in decoder.Decode(packet):
            return tuple(torch.from_dlpack(frame).stride())
    return ()


def test_444_hevc_decodes_on_the_cpu_with_the_pipeline_named(tmp_path: Path) -> None:
    path = write_format_sequence_ts(tmp_path / "444.ts", [("libx265", "yuv444p")])
    reader = NvdecSourceReader(str(path))
    _, _, kinds = _read(reader)
    assert kinds == ["cpu"] * 20
    # NVDEC itself decodes HEVC 4:4:4 on this GPU: what refuses is our pipeline's surfaces.
    assert reader.choice.label == "pipeline"
    fmt = VideoFormat("hevc", "444", 8, 320, 240)
    assert choose(fmt, lambda *a: decoder_caps(0, *a)).label == "pipeline"
