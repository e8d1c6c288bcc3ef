"""The decoder of a stream, chosen by what NVDEC and the GPU pipeline take (no GPU needed).

Capabilities are the recorded ones (tests/support/media/nvdec_caps.json, as PyNvVideoCodec's
`GetDecoderCaps` answers them); the NVDEC reader runs on the PyNvVideoCodec stand-in
(tests/support/fake_nvc.py), whose frames are FFmpeg's own.
"""

from __future__ import annotations

import enum
import hashlib
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
import torch
from prometheus_client import generate_latest
from support.fake_nvc import HOPPER_CAPS, FakeNvc
from support.ingest import take_in_background
from support.truth import SAMPLE
from support.waiting import wait_until

from vdet.core.types import SourceState, VideoFrame
from vdet.gpu.devices import frame_to_bgr
from vdet.ingest.decode_choice import (
    DecodeChoice,
    DecoderCaps,
    VideoFormat,
    choose,
    format_of,
)
from vdet.ingest.mailbox import FrameMailbox
from vdet.ingest.nvdec import GpuVideoFrame, decoder_caps
from vdet.ingest.nvdec_reader import NvdecSourceReader, select_reader
from vdet.ingest.reader import DamagedFrame, DecodeError, SourceReader
from vdet.ingest.source_thread import IngestOptions, SourceThread
from vdet.metrics.registry import Metrics
from vdet.modelkit.dataset.media_cases import write_format_sequence_ts, write_lossy_ts


def recorded(codec: str, chroma: str, bits: int) -> DecoderCaps | None:
    key = f"{ {'h264': 'H264', 'hevc': 'HEVC'}[codec] }/{chroma}/{bits}"
    caps = HOPPER_CAPS.get(key)
    return None if caps is None else DecoderCaps.from_pynvvideocodec(dict(caps))


@pytest.mark.parametrize(
    ("fmt", "path", "label"),
    [
        (VideoFormat("h264", "420", 8, 1920, 1080), "nvdec", "none"),
        (VideoFormat("hevc", "420", 8, 3840, 2160), "nvdec", "none"),
        (VideoFormat("hevc", "420", 10, 1920, 1080), "nvdec", "none"),
        (VideoFormat("hevc", "444", 8, 1920, 1080), "cpu", "pipeline"),
        (VideoFormat("hevc", "444", 10, 1920, 1080), "cpu", "pipeline"),
        (VideoFormat("h264", "420", 10, 1920, 1080), "cpu", "format"),
        (VideoFormat("h264", "422", 8, 1920, 1080), "cpu", "format"),
        (VideoFormat("hevc", "422", 10, 1920, 1080), "cpu", "format"),
        (VideoFormat("h264", "420", 8, 7680, 4320), "cpu", "size"),
        (VideoFormat("h264", "420", 8, 32, 16), "cpu", "size"),
        (VideoFormat("mpeg4", "420", 8, 640, 480), "cpu", "codec"),
        (VideoFormat("av1", "420", 8, 1920, 1080), "cpu", "codec"),
    ],
    ids=lambda v: v.describe() if isinstance(v, VideoFormat) else str(v),
)
def test_the_choice_follows_the_recorded_caps(fmt: VideoFormat, path: str, label: str) -> None:
    choice = choose(fmt, recorded)
    assert (choice.path, choice.label) == (path, label)
    if path == "cpu":
        assert choice.reason is not None and choice.reason.startswith(fmt.describe())
        assert choice.reason.endswith("decoded on the CPU")
    else:
        assert choice.reason is None


def test_what_nothing_can_be_asked_of_goes_to_the_cpu_and_unknowns_to_nvdec() -> None:
    fmt = VideoFormat("h264", "420", 8, 1280, 720)
    assert choose(fmt, lambda *_: None).label == "format"
    assert choose(None, recorded) == DecodeChoice("nvdec")
    # A pipeline without 16-bit surfaces would send 10-bit HEVC to the CPU.
    ten = VideoFormat("hevc", "420", 10, 1920, 1080)
    assert choose(ten, recorded, frozenset({("420", 8)})).label == "pipeline"


@pytest.mark.parametrize(
    ("pix_fmt", "chroma", "bits"),
    [
        ("yuv420p", "420", 8),
        ("yuvj420p", "420", 8),
        ("nv12", "420", 8),
        ("yuv420p10le", "420", 10),
        ("p010le", "420", 10),
        ("yuv422p", "422", 8),
        ("yuv422p10le", "422", 10),
        ("yuv444p", "444", 8),
        ("yuv444p12le", "444", 12),
        ("gray", "400", 8),
        ("gray10le", "400", 10),
    ],
)
def test_formats_are_read_from_ffmpeg_pixel_formats(pix_fmt: str, chroma: str, bits: int) -> None:
    assert format_of("hevc", pix_fmt, 640, 360) == VideoFormat("hevc", chroma, bits, 640, 360)


def test_an_unknown_pixel_format_is_no_format() -> None:
    assert format_of("h264", None, 640, 360) is None
    assert format_of("h264", "no-such-format", 640, 360) is None


def _read(reader: SourceReader) -> list[object]:
    with reader:
        reader.open()
        return list(reader.frames())


def test_a_10_bit_hevc_stream_decodes_on_nvdec_into_p016(tmp_path: Path) -> None:
    """HEVC Main10 goes to NVDEC: 16-bit surfaces (P016) whose samples are FFmpeg's 10-bit
    ones in the high bits, read through PyNvVideoCodec's odd strides; as BGR within a level of
    FFmpeg's own conversion with nearest chroma."""
    path = write_format_sequence_ts(tmp_path / "main10.ts", [("libx265", "yuv420p10le")])
    nvc = FakeNvc()
    reader = NvdecSourceReader(str(path), nvc=nvc, device="cpu")
    items = _read(reader)
    assert (reader.choice.path, reader.choice.label) == ("nvdec", "none")
    assert "HEVC/420/10" in nvc.caps_asked and nvc.sessions
    assert len(items) == 20 and all(isinstance(i, GpuVideoFrame) for i in items)
    with av.open(str(path)) as container:
        reference = list(container.decode(container.streams.video[0]))
    for item, frame in zip(items, reference, strict=True):
        assert isinstance(item, GpuVideoFrame)
        assert item.bits == 10 and item.nv12.dtype == torch.uint16
        assert tuple(item.nv12.shape) == (360, 320) and item.nv12.is_contiguous()
        planar = frame.to_ndarray()  # yuv420p10le: Y, then the U and V planes
        assert np.array_equal(item.nv12[:240].numpy() >> 6, planar[:240])
        u = planar.reshape(-1)[240 * 320 : 240 * 320 + 120 * 160].reshape(120, 160)
        assert np.array_equal(item.nv12[240:].numpy()[:, 0::2] >> 6, u)
        sws = frame.reformat(format="bgr24", interpolation="POINT").to_ndarray()
        diff = np.abs(frame_to_bgr(item).astype(int) - sws.astype(int))
        assert diff.max() <= 3 and diff.mean() < 1.0


def test_a_444_hevc_stream_opens_on_the_cpu_with_the_reason(tmp_path: Path) -> None:
    path = write_format_sequence_ts(tmp_path / "444.ts", [("libx265", "yuv444p")])
    nvc = FakeNvc()
    reader = NvdecSourceReader(str(path), nvc=nvc, device="cpu")
    items = _read(reader)
    assert reader.choice.label == "pipeline"
    assert "hevc 4:4:4 8-bit 320x240" in (reader.choice.reason or "")
    assert "HEVC/444/8" in nvc.caps_asked
    assert len(items) == 20 and all(isinstance(i, VideoFrame) for i in items)
    assert not nvc.sessions  # NVDEC never asked to decode it
    strict = NvdecSourceReader(str(path), strict=True, nvc=FakeNvc(), device="cpu")
    with strict, pytest.raises(Exception, match="decoder 'nvdec' is set, but hevc 4:4:4 8-bit"):
        strict.open()


def test_a_new_sequence_moves_the_stream_between_decoders(tmp_path: Path) -> None:
    parts = [("libx264", "yuv420p"), ("libx264", "yuv420p10le"), ("libx264", "yuv420p")]
    path = write_format_sequence_ts(tmp_path / "switch.ts", parts)
    with av.open(str(path)) as container:
        reference = [
            (frame.pts, frame.format.name) for frame in container.decode(container.streams.video[0])
        ]
    reader = NvdecSourceReader(str(path), source_id="cam", nvc=FakeNvc(), device="cpu")
    choices: list[str] = []
    kinds: list[str] = []
    with reader:
        reader.open()
        for item in reader.frames():
            choices.append(reader.choice.label)
            assert not isinstance(item, DecodeError), item
            kinds.append("gpu" if isinstance(item, GpuVideoFrame) else "cpu")
    # 8-bit on NVDEC, 10-bit H.264 (not an NVDEC format) on the CPU, then NVDEC again: every
    # frame, in order, indexes counting on.
    assert kinds == ["gpu"] * 20 + ["cpu"] * 20 + ["gpu"] * 20
    assert len(reference) == 60 and reader.decoder_switches == 2
    assert "format" in choices and reader.choice.path == "nvdec"


def test_the_cpu_reader_of_a_gpu_node_says_why() -> None:
    reader = select_reader(str(SAMPLE), decoder="cpu")
    assert (reader.choice.path, reader.choice.label) == ("cpu", "configured")


@pytest.fixture(scope="module")
def ts_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The sample clip as MPEG-TS, whole and with transport packets lost."""
    folder = tmp_path_factory.mktemp("lossy")
    assert write_lossy_ts(SAMPLE, folder / "clean.ts", every=10**9) == 0
    assert write_lossy_ts(SAMPLE, folder / "lossy.ts") > 20
    return folder / "clean.ts", folder / "lossy.ts"


def _kept_and_damaged(reader: SourceReader) -> tuple[dict[float, bytes], int]:
    """The frames handed on (a digest of their pixels by time) and the damaged reports."""
    kept: dict[float, bytes] = {}
    damaged = 0
    for item in _read(reader):
        if isinstance(item, DamagedFrame):
            damaged += 1
        elif isinstance(item, GpuVideoFrame):
            assert item.pts_seconds is not None
            kept[round(item.pts_seconds, 3)] = hashlib.sha1(item.nv12.numpy().tobytes()).digest()
        elif isinstance(item, VideoFrame):
            assert item.pts_seconds is not None
            kept[round(item.pts_seconds, 3)] = hashlib.sha1(item.image_bgr.tobytes()).digest()
    return kept, damaged


def test_nvdec_drops_the_frames_of_a_damaged_chain_as_the_cpu_does(
    ts_pair: tuple[Path, Path],
) -> None:
    clean_ts, lossy_ts = ts_pair
    clean, _ = _kept_and_damaged(NvdecSourceReader(str(clean_ts), nvc=FakeNvc(), device="cpu"))
    cpu_kept, cpu_damaged = _kept_and_damaged(SourceReader(str(lossy_ts)))
    nvdec = NvdecSourceReader(str(lossy_ts), nvc=FakeNvc(), device="cpu")
    kept, damaged = _kept_and_damaged(nvdec)
    # The demuxer's corrupt-packet flags are the signal on both paths. Every frame the NVDEC
    # path hands on is bit for bit the whole clip's frame: no concealment gets through.
    assert len(clean) == 300 and all(clean[pts] == digest for pts, digest in kept.items())
    assert len(kept) + damaged == 300 == len(cpu_kept) + cpu_damaged
    assert nvdec.damaged_frames == damaged >= 100
    # The NVDEC path marks each frame by its own packet (decode order); the CPU path marks
    # the frames its decoder returns after the flagged packet, some of them decoded before
    # it (frame threads hold a few back): it drops those few intact frames more.
    assert set(cpu_kept) <= set(kept) and 0.9 * cpu_damaged <= damaged <= cpu_damaged
    passing = NvdecSourceReader(str(lossy_ts), nvc=FakeNvc(), device="cpu")
    passing.pass_damaged_frames = True
    passed, reported = _kept_and_damaged(passing)
    assert len(passed) == 300 and reported == damaged


def test_the_stream_status_and_metrics_say_which_decoder_and_why(tmp_path: Path) -> None:
    parts = [("libx264", "yuv420p"), ("libx264", "yuv420p10le")]
    path = write_format_sequence_ts(tmp_path / "switch.ts", parts)

    def factory(url: str, **options: Any) -> SourceReader:
        return NvdecSourceReader(url, nvc=FakeNvc(), device="cpu", **options)

    options = IngestOptions(realtime=False, loop_files=False)
    worker = SourceThread("cam", str(path), FrameMailbox(), options, reader_factory=factory)
    metrics = Metrics()
    metrics.add_source("cam", SourceState.CONNECTING)
    worker.start()
    take_in_background(worker.mailbox)
    try:
        wait_until(lambda: worker.status().state is SourceState.STOPPED, 30, what="the end")
    finally:
        worker.stop()
    status = worker.status()
    assert (status.decode_path, status.decode_reason_label) == ("cpu", "format")
    assert "h264 4:2:0 10-bit 320x240" in (status.decode_reason or "")
    assert any("decoder: h264 4:2:0 10-bit" in line for line in status.history)
    assert status.frames_decoded == 40
    metrics.sync_source("cam", status)
    text = generate_latest(metrics.registry).decode()
    assert 'vdet_source_decode_path{path="cpu",reason="format",source="cam"} 1.0' in text


class _Chroma(enum.Enum):
    """A binding's enum spelled as cuvid's names end: Monochrome, _420, ..."""

    Monochrome = "400"
    _420 = "420"
    _422 = "422"
    _444 = "444"


class _Minus8Nvc(FakeNvc):
    """A binding whose `bitdepth` is cuvid's nBitDepthMinus8 and whose chroma enum is spelled
    otherwise: the caps must come out the same."""

    cudaVideoChromaFormat = _Chroma  # type: ignore[assignment]  # noqa: N815

    def GetDecoderCaps(  # noqa: N802
        self, gpuid: int, codec: str, chromaformat: Any, bitdepth: int
    ) -> dict[str, int]:
        return super().GetDecoderCaps(gpuid, codec, chromaformat.value, bitdepth + 8)


@pytest.mark.parametrize("nvc", [FakeNvc(), _Minus8Nvc()], ids=["bit-depth", "minus-8"])
def test_caps_are_asked_whichever_way_the_binding_takes_them(nvc: FakeNvc) -> None:
    assert decoder_caps(0, "hevc", "420", 10, nvc=nvc) == recorded("hevc", "420", 10)
    assert decoder_caps(0, "h264", "420", 8, nvc=nvc) == recorded("h264", "420", 8)
    h264_10 = decoder_caps(0, "h264", "420", 10, nvc=nvc)
    assert h264_10 is not None and not h264_10.supported
    assert decoder_caps(0, "hevc", "444", 12, nvc=nvc) == recorded("hevc", "444", 12)
