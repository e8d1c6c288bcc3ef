"""A source reader that demuxes with PyAV and decodes on the GPU with NVDEC, and the choice
between it and the CPU reader.

`NvdecSourceReader` is a `SourceReader` (same open/interrupt/close, timeouts, looping and
pacing; the source thread drives it unchanged) whose `frames()` yields `GpuVideoFrame`s instead of
BGR `VideoFrame`s while the stream's format is one NVDEC and the GPU pipeline take: PyAV only
demuxes, length-prefixed MP4/MKV packets go through `{codec}_mp4toannexb`, Annex B ones (RTSP)
as they are, with the SDP's parameter sets (`extradata`) fed to each new session. An NVDEC
failure is yielded as a `DecodeError`, which the source thread counts like a CPU decode error.

The decoder is chosen per sequence (vdet.ingest.decode_choice): when the stream opens, from
FFmpeg's description of it, and again at every new sequence header (SPS), from a CPU decode of
that keyframe: codec, chroma format, bit depth and size against the GPU decoder's caps and the
pipeline's surfaces. A format either cannot take is decoded on the CPU in the same stream
(`VideoFrame`s; decoder "auto"), with the reason in `choice`, or fails to open ("nvdec"); a
later sequence NVDEC takes moves the stream back.

Damage is tracked as on the CPU path (vdet.ingest.reader.CpuDecoding) with the signals NVDEC's
path has: the demuxer's corrupt-packet flags (an MPEG-TS continuity error, say), H.264
pictures that follow lost reference pictures (frame_num, vdet.ingest.reference_chain: whole
frames lost on an RTSP link), RTP packets missing from an RTSP camera's sequence (read on the
way by vdet.ingest.rtsp_relay: losses inside a picture, which FFmpeg's decoder would flag on
the CPU path) and NVDEC failures damage the reference chain until the next intact keyframe
packet; each decoded frame carries the state of its own packet (by presentation time, so
reordered B-frames too), and the frames of a damaged chain are reported and dropped unless
passed. NVDEC's per-picture decode status (concealed errors inside a slice) is not reachable
through PyNvVideoCodec 2.2.

`select_reader` is the one place that decides: decoder "cpu" -> `SourceReader`; "nvdec" ->
`NvdecSourceReader` or an error when NVDEC is missing; "auto" -> NVDEC when `nvdec_available()`
(PyNvVideoCodec, a CUDA GPU, decoder caps), else the CPU reader. Consumers of its frames must
accept `GpuVideoFrame` whenever the choice can be NVDEC.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, cast

import av
import av.bitstream

from vdet.core.redact import redact
from vdet.core.types import VideoFrame
from vdet.ingest.bitstream import is_length_prefixed, sequence_header
from vdet.ingest.decode_choice import (
    NVDEC,
    DecodeChoice,
    DecoderCaps,
    VideoFormat,
    choose,
    format_of,
)
from vdet.ingest.nvdec import (
    NVDEC_CODECS,
    DecodedNv12,
    GpuVideoFrame,
    NvdecDecoder,
    NvdecError,
    colour_from_metadata,
    decoder_caps,
    nvdec_available,
)
from vdet.ingest.reader import CpuDecoding, DecodeError, SourceError, SourceReader, StreamInfo
from vdet.ingest.rtsp_relay import RtpLoss
from vdet.ingest.urls import SourcePolicy

log = logging.getLogger(__name__)

DecoderChoice = Literal["auto", "nvdec", "cpu"]
DECODER_CHOICES: tuple[DecoderChoice, ...] = ("auto", "nvdec", "cpu")


def select_reader(
    url: str,
    *,
    decoder: str = "auto",
    gpu: int = 0,
    source_id: str = "",
    connect_timeout_s: float = 5.0,
    read_timeout_s: float = 5.0,
    loop: bool = False,
    realtime: bool = False,
    policy: SourcePolicy | None = None,
    nvc: Any = None,
    device: str | None = None,
) -> SourceReader:
    """The reader for `url` under the `decoder` choice (module docstring).

    `nvc` replaces the PyNvVideoCodec module and `device` the torch device frames land on
    (tests: a CPU stand-in for NVDEC); with `nvc` given NVDEC counts as available.
    """
    if decoder not in DECODER_CHOICES:
        raise ValueError(f"decoder must be one of {DECODER_CHOICES}, got {decoder!r}")
    options: dict[str, Any] = {
        "source_id": source_id,
        "connect_timeout_s": connect_timeout_s,
        "read_timeout_s": read_timeout_s,
        "loop": loop,
        "realtime": realtime,
        "policy": policy,
    }
    if decoder == "cpu":
        reader = SourceReader(url, **options)
        reader.choice = DecodeChoice("cpu", "gpu.decoder is 'cpu'", "configured")
        return reader
    if nvc is None and not nvdec_available(gpu):
        if decoder == "nvdec":
            raise RuntimeError(
                f"decoder 'nvdec' but NVDEC is not available on GPU {gpu} (needs PyNvVideoCodec, "
                "a CUDA device and the driver's libnvcuvid); use 'auto' to fall back to the CPU"
            )
        reader = SourceReader(url, **options)
        reader.choice = DecodeChoice(
            "cpu", f"NVDEC is not available on GPU {gpu}; decoded on the CPU", "unavailable"
        )
        return reader
    return NvdecSourceReader(
        url, gpu=gpu, strict=decoder == "nvdec", nvc=nvc, device=device, **options
    )


class NvdecSourceReader(SourceReader):
    """`SourceReader` with NVDEC decoding; `frames()` yields `GpuVideoFrame` (module docstring).

    `strict`: a stream whose format NVDEC or the pipeline cannot take fails `open()`
    (SourceError) instead of being decoded on the CPU. `nvc` replaces the PyNvVideoCodec
    module (tests; its `GetDecoderCaps` then answers the format questions). `choice` is the
    current sequence's decoder and why; `decoder_switches` counts moves between decoders.
    """

    def __init__(
        self,
        url: str,
        *,
        gpu: int = 0,
        strict: bool = False,
        nvc: Any = None,
        device: str | None = None,
        **options: Any,
    ) -> None:
        super().__init__(url, **options)
        self.gpu = gpu
        self.strict = strict
        self._nvc = nvc
        self._device = device
        self.choice: DecodeChoice = NVDEC
        self.format: VideoFormat | None = None  # the current sequence's, when FFmpeg told
        self.decoder_switches = 0
        self.decoder: NvdecDecoder | None = None
        # NVDEC flags no concealed loss: RTP gaps are read on the way instead (RTSP only).
        self.watch_rtp = True

    @property
    def on_cpu(self) -> bool:
        return self.choice.path == "cpu"

    def _caps(self, codec: str, chroma: str, bit_depth: int) -> DecoderCaps | None:
        return decoder_caps(self.gpu, codec, chroma, bit_depth, nvc=self._nvc)

    def open(self) -> StreamInfo:
        info = super().open()
        _, stream = self._require_open()
        context = stream.codec_context
        fmt = format_of(info.codec, context.pix_fmt, info.width, info.height)
        if fmt is None and info.codec not in NVDEC_CODECS:  # its name alone rules NVDEC out
            fmt = VideoFormat(info.codec, "420", 8, info.width, info.height)
        self.format = fmt
        self.choice = choose(fmt, self._caps)
        if self.choice.path == "cpu":
            if self.strict:
                why = (self.choice.reason or "").removesuffix("; decoded on the CPU")
                raise SourceError(f"decoder 'nvdec' is set, but {why} ({redact(self.url)})")
            log.info("source %s: %s", self.source_id, self.choice.reason)
        return info

    def frames(  # type: ignore[override]
        self, first_index: int = 0
    ) -> Iterator[GpuVideoFrame | VideoFrame | DecodeError]:
        """Decoded frames and decode errors until the end, as `SourceReader.frames`:
        `GpuVideoFrame`s while NVDEC decodes, `VideoFrame`s while the CPU does."""
        _, stream = self._require_open()
        timeline = self._new_timeline()
        cpu = CpuDecoding(self, timeline, first_index)
        if stream.codec_context.name not in NVDEC_CODECS:  # never NVDEC: the CPU throughout
            yield from super().frames(first_index)
            return
        gpu = _NvdecDecoding(self, stream, timeline, cpu)
        sequence: bytes | None = None
        try:
            packets = self._video_packets(timeline)
            try:
                for packet, arrival in packets:
                    if packet.size == 0:  # end of this pass: drain the decoder
                        if self.choice.path == "nvdec":
                            yield from gpu.end_pass(arrival)
                        else:
                            yield from cpu.feed(packet, arrival)
                        continue
                    # The MP4-to-Annex-B filter takes the packet (its data and fields): what
                    # NVDEC needs of it is read first, and while the CPU decodes, the filter
                    # gets a copy (Annex B packets are only read: no copy for them).
                    mark = _Mark(packet.pts, bool(packet.is_keyframe), bool(packet.is_corrupt))
                    spare = self.choice.path == "nvdec" or not gpu.length_prefixed
                    units = gpu.annex_b(packet if spare else _copy_of(packet))
                    sps = _first_sequence_header(units, gpu.codec)
                    if sps is not None and sps != sequence:
                        if sequence is not None or self.choice.path == "cpu":
                            yield from self._choose_again(units, gpu, cpu, stream, arrival)
                        sequence = sps
                    if self.choice.path == "nvdec":
                        yield from gpu.feed(mark, units, arrival)
                    else:
                        yield from cpu.feed(packet, arrival)
            finally:
                packets.close()  # ends the demuxer, which restores PyAV's "no timeout" state
        finally:
            gpu.close()

    def _choose_again(
        self,
        units: list[bytes],
        gpu: _NvdecDecoding,
        cpu: CpuDecoding,
        stream: av.VideoStream,
        arrival: float,
    ) -> Iterator[GpuVideoFrame | VideoFrame | DecodeError]:
        """A new sequence: choose its decoder; moving, drain the one it leaves."""
        fmt = _probe_format(gpu.codec, units)
        if fmt is not None:
            self.format = fmt
        choice = choose(fmt, self._caps)
        if choice.path != self.choice.path:
            if self.choice.path == "nvdec":
                yield from gpu.flush(arrival)
            else:
                yield from cpu.drain(stream.codec_context, arrival)
            self.decoder_switches += 1
            log.info(
                "source %s: new sequence, %s",
                self.source_id,
                choice.reason or "decoded on NVDEC again",
            )
        self.choice = choice


@dataclass(frozen=True)
class _Mark:
    """What the NVDEC path needs of a packet besides its bytes."""

    pts: int | None
    is_keyframe: bool
    is_corrupt: bool


def _copy_of(packet: av.Packet[Any]) -> av.Packet[Any]:
    """A packet with the same bytes, times and key flag (no side data)."""
    copy = av.Packet(bytes(packet))
    copy.pts, copy.dts, copy.time_base = packet.pts, packet.dts, packet.time_base
    copy.is_keyframe = packet.is_keyframe
    return copy


def _first_sequence_header(units: list[bytes], codec: str) -> bytes | None:
    for unit in units:
        sps = sequence_header(unit, codec)
        if sps is not None:
            return sps
    return None


def _probe_format(codec: str, units: list[bytes]) -> VideoFormat | None:
    """The format of the sequence a keyframe's Annex B units start, from FFmpeg's decode of
    them on the CPU (once per new sequence header)."""
    context = cast("av.VideoCodecContext", av.CodecContext.create(codec, "r"))
    frames: list[Any] = []
    try:
        for unit in units:
            frames += context.decode(av.Packet(unit))
        frames += context.decode(None)
    except av.FFmpegError:
        pass
    if frames:
        first = frames[0]
        return format_of(codec, first.format.name, first.width, first.height)
    return format_of(codec, context.pix_fmt, context.width, context.height)


# RTP losses whose picture has not come yet; more (a pts that never reaches them) are taken
# at once.
_MAX_PENDING_LOSSES = 64
# Frames fed to NVDEC whose output is awaited, by presentation time: enough for any
# reordering depth; older entries (frames the decoder never returned) are forgotten.
_MAX_AWAITED = 64


class _NvdecDecoding:
    """NVDEC's decoding of a reader's packets into `GpuVideoFrame`s, with the reader's damage
    rules; shares frame indexes and error counts with the reader's `CpuDecoding`."""

    def __init__(
        self,
        reader: NvdecSourceReader,
        stream: av.VideoStream,
        timeline: Any,
        cpu: CpuDecoding,
    ) -> None:
        self.reader = reader
        self.stream = stream
        self.timeline = timeline
        self.cpu = cpu
        context = stream.codec_context
        self.codec = context.name
        self.extradata = bytes(context.extradata or b"")
        self.length_prefixed = is_length_prefixed(self.extradata)
        self.matrix, self.colour_range = colour_from_metadata(
            context.colorspace, context.color_range, context.pix_fmt
        )
        # The MP4-to-Annex-B filter keeps state from packet to packet (such as whether it
        # has put the parameter sets before a keyframe yet); each pass, a seek back to the
        # start, gets a fresh one, as a reopened file would, so every pass opens with its
        # parameter sets (the decoder keeps its session across passes when nothing is held
        # back).
        self._annexb: av.bitstream.BitStreamFilterContext | None = None
        self._annexb_pass = -1
        self.damage: str | None = None  # why the reference chain of the packets fed is damaged
        self._awaited: dict[int, str | None] = {}  # pts -> its packet's damage
        self._last_corrupt = False
        self._rtp_losses: list[RtpLoss] = []  # seen on the way, their pictures not yet fed

    def annex_b(self, packet: av.Packet[Any]) -> list[bytes]:
        if not self.length_prefixed:
            return [bytes(packet)]
        if self._annexb_pass != self.timeline.pass_index:
            self._annexb = av.bitstream.BitStreamFilterContext(
                f"{self.codec}_mp4toannexb", self.stream
            )
            self._annexb_pass = self.timeline.pass_index
        assert self._annexb is not None
        return [bytes(unit) for unit in self._annexb.filter(packet)]

    def _rtp_lost(self, pts: int | None) -> int:
        """RTP packets lost in or before the picture of the packet with `pts`: the losses
        whose first damaged picture (its RTP time, which is the packet's pts) is this one or
        an earlier one; all of them when the packet has no pts."""
        self._rtp_losses += self.reader.rtp_losses()
        lost = 0
        while self._rtp_losses and (
            pts is None
            or self._rtp_losses[0].ticks <= pts
            or len(self._rtp_losses) > _MAX_PENDING_LOSSES
        ):
            lost += self._rtp_losses.pop(0).packets
        return lost

    def _decoder(self) -> NvdecDecoder:
        if self.reader.decoder is None:
            context = self.stream.codec_context
            self.reader.decoder = NvdecDecoder(
                self.codec,
                gpu=self.reader.gpu,
                b_frames=bool(context.has_b_frames),
                header=None if self.length_prefixed or not self.extradata else self.extradata,
                nvc=self.reader._nvc,
                device=self.reader._device,
            )
        fmt = self.reader.format
        self.reader.decoder.sample_bits = fmt.bit_depth if fmt and fmt.bit_depth > 8 else None
        return self.reader.decoder

    def feed(
        self, packet: _Mark, units: list[bytes], arrival: float
    ) -> Iterator[GpuVideoFrame | DecodeError]:
        reader, cpu = self.reader, self.cpu
        decoder = self._decoder()
        started = time.perf_counter()
        if packet.is_corrupt:
            self.damage = "the demuxer flagged a corrupt packet"
        elif packet.is_keyframe and not self._last_corrupt:
            self.damage = None
        # The MPEG-TS demuxer can flag the packet before the one that lost data (a
        # continuity gap at a packet boundary): a keyframe right after a flagged packet does
        # not end the damage (what FFmpeg's decoder finds concealed in it on the CPU path).
        self._last_corrupt = packet.is_corrupt
        if self.codec == "h264":
            for unit in units:
                gap = cpu.chain_gap(unit)
                if gap is not None:
                    self.damage = gap
        lost = self._rtp_lost(packet.pts)
        if lost:
            self.damage = f"{lost} RTP packet(s) missing from the camera's sequence"
        if packet.pts is not None:
            self._awaited[packet.pts] = self.damage
            while len(self._awaited) > _MAX_AWAITED:
                del self._awaited[next(iter(self._awaited))]
        decoded: list[DecodedNv12] = []
        try:
            for unit in units:
                decoded += decoder.decode(unit, packet.pts, packet.is_keyframe)
        except NvdecError as exc:
            reader.decode_errors += 1
            cpu.consecutive_errors += 1
            self.damage = "NVDEC failed on a packet"
            yield DecodeError(f"NvdecError: {exc}", cpu.consecutive_errors)
            return
        yield from self._frames(decoded, started, arrival)

    def end_pass(self, arrival: float) -> Iterator[GpuVideoFrame | DecodeError]:
        """The end of a pass (or of the file): the frames the session holds back."""
        decoder = self.reader.decoder
        if decoder is None:
            return
        started = time.perf_counter()
        try:
            decoded = decoder.end_pass() if self.reader.loop else decoder.flush()
        except NvdecError as exc:
            self.reader.decode_errors += 1
            yield DecodeError(f"NvdecError: {exc}", self.cpu.consecutive_errors + 1)
            return
        yield from self._frames(decoded, started, arrival)

    def flush(self, arrival: float) -> Iterator[GpuVideoFrame | DecodeError]:
        """The stream moves to the CPU: the frames the session holds, and the session ends."""
        decoder = self.reader.decoder
        if decoder is None:
            return
        started = time.perf_counter()
        try:
            decoded = decoder.flush()
        except NvdecError as exc:
            self.reader.decode_errors += 1
            yield DecodeError(f"NvdecError: {exc}", self.cpu.consecutive_errors + 1)
            return
        yield from self._frames(decoded, started, arrival)

    def _frames(
        self, decoded: list[DecodedNv12], started: float, arrival: float
    ) -> Iterator[GpuVideoFrame | DecodeError]:
        reader, cpu = self.reader, self.cpu
        share = (time.perf_counter() - started) / max(1, len(decoded))
        decoder = reader.decoder
        for frame in decoded:
            damage = (
                self._awaited.pop(frame.pts, self.damage) if frame.pts is not None else self.damage
            )
            if damage is not None:
                yield cpu.damaged(damage, frame.pts, arrival)
                if not reader.pass_damaged_frames:
                    continue
            pts_s, frame_arrival = self.timeline.place_frame(frame.pts, arrival)
            cpu.consecutive_errors = 0
            yield GpuVideoFrame(
                source_id=reader.source_id,
                index=cpu.index,
                pts_seconds=pts_s,
                arrival_time=frame_arrival,
                decode_seconds=share,
                width=frame.width,
                height=frame.height,
                nv12=frame.nv12,
                matrix=self.matrix,
                colour_range=self.colour_range,
                stream=None if decoder is None else decoder.stream,
                ready=frame.ready,
                bits=frame.bits,
            )
            cpu.index += 1

    def close(self) -> None:
        if self.reader.decoder is not None:
            self.reader.decoder.close()


__all__ = ["DECODER_CHOICES", "DecoderChoice", "NvdecSourceReader", "select_reader"]
