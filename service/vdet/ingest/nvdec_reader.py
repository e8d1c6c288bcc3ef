"""A source reader that demuxes with PyAV and decodes on the GPU with NVDEC, and the choice
between it and the CPU reader.

`NvdecSourceReader` is a `SourceReader` (same open/interrupt/close, timeouts, looping and
pacing; the source thread drives it unchanged) whose `frames()` yields `GpuVideoFrame`s instead of
BGR `VideoFrame`s for H.264 and HEVC: PyAV only demuxes, length-prefixed MP4/MKV packets go
through `{codec}_mp4toannexb`, Annex B ones (RTSP) as they are, with the SDP's parameter sets
(`extradata`) fed to each new session. An NVDEC failure is yielded as a `DecodeError`, which
the source thread counts like a CPU decode error. A codec NVDEC cannot decode falls back to the CPU
path inside the same reader (decoder "auto"), or fails to open ("nvdec").

`select_reader` is the one place that decides: decoder "cpu" -> `SourceReader`; "nvdec" ->
`NvdecSourceReader` or an error when NVDEC is missing; "auto" -> NVDEC when `nvdec_available()`
(PyNvVideoCodec, a CUDA GPU, decoder caps), else the CPU reader. Consumers of its frames must
accept `GpuVideoFrame` whenever the choice can be NVDEC.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any, Literal

import av
import av.bitstream

from vdet.core.redact import redact
from vdet.core.types import VideoFrame
from vdet.ingest.nvdec import (
    NVDEC_CODECS,
    DecodedNv12,
    GpuVideoFrame,
    NvdecDecoder,
    NvdecError,
    colour_from_metadata,
    is_length_prefixed,
    nvdec_available,
)
from vdet.ingest.reader import DecodeError, SourceError, SourceReader, StreamInfo
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
        return SourceReader(url, **options)
    if nvc is None and not nvdec_available(gpu):
        if decoder == "nvdec":
            raise RuntimeError(
                f"decoder 'nvdec' but NVDEC is not available on GPU {gpu} (needs PyNvVideoCodec, "
                "a CUDA device and the driver's libnvcuvid); use 'auto' to fall back to the CPU"
            )
        return SourceReader(url, **options)
    return NvdecSourceReader(
        url, gpu=gpu, strict=decoder == "nvdec", nvc=nvc, device=device, **options
    )


class NvdecSourceReader(SourceReader):
    """`SourceReader` with NVDEC decoding; `frames()` yields `GpuVideoFrame` (module docstring).

    `strict`: a stream NVDEC cannot decode fails `open()` (SourceError) instead of being
    decoded on the CPU. `nvc` replaces the PyNvVideoCodec module (tests).
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
        self.on_cpu = False
        self.decoder: NvdecDecoder | None = None

    def open(self) -> StreamInfo:
        info = super().open()
        codec = info.codec
        if codec in NVDEC_CODECS and (self._nvc is not None or nvdec_available(self.gpu, codec)):
            return info
        if self.strict:
            raise SourceError(
                f"NVDEC cannot decode {codec} ({redact(self.url)}); decoder 'nvdec' is set"
            )
        log.info("source %s: NVDEC does not decode %s; decoding on the CPU", self.source_id, codec)
        self.on_cpu = True
        return info

    def frames(  # type: ignore[override]
        self, first_index: int = 0
    ) -> Iterator[GpuVideoFrame | VideoFrame | DecodeError]:
        """Decoded frames and decode errors until the end, as `SourceReader.frames`, but
        `GpuVideoFrame`s (unless the codec made `open()` choose the CPU)."""
        if self.on_cpu:
            yield from super().frames(first_index)
            return
        _, stream = self._require_open()
        context = stream.codec_context
        codec = context.name
        extradata = bytes(context.extradata or b"")
        length_prefixed = is_length_prefixed(extradata)
        matrix, colour_range = colour_from_metadata(
            context.colorspace, context.color_range, context.pix_fmt
        )
        timeline = self._new_timeline()
        decoder = NvdecDecoder(
            codec,
            gpu=self.gpu,
            b_frames=bool(context.has_b_frames),
            header=None if length_prefixed or not extradata else extradata,
            nvc=self._nvc,
            device=self._device,
        )
        self.decoder = decoder
        index = first_index
        consecutive_errors = 0

        def emit(
            decoded: list[DecodedNv12], started: float, arrival: float
        ) -> Iterator[GpuVideoFrame]:
            nonlocal index
            share = (time.perf_counter() - started) / max(1, len(decoded))
            for frame in decoded:
                pts_s, frame_arrival = timeline.place_frame(frame.pts, arrival)
                yield GpuVideoFrame(
                    source_id=self.source_id,
                    index=index,
                    pts_seconds=pts_s,
                    arrival_time=frame_arrival,
                    decode_seconds=share,
                    width=frame.width,
                    height=frame.height,
                    nv12=frame.nv12,
                    matrix=matrix,
                    colour_range=colour_range,
                    stream=decoder.stream,
                    ready=frame.ready,
                )
                index += 1

        # The MP4-to-Annex-B filter keeps state from packet to packet (such as whether it has
        # put the parameter sets before a keyframe yet); each pass, a seek back to the start,
        # gets a fresh one, as a reopened file would, so every pass opens with its parameter
        # sets (the decoder keeps its session across passes when nothing is held back).
        annexb: av.bitstream.BitStreamFilterContext | None = None
        annexb_pass = -1
        try:
            packets = self._video_packets(timeline)
            try:
                for packet, arrival in packets:
                    started = time.perf_counter()
                    if packet.size == 0:  # end of this pass: drain the session
                        try:
                            decoded = decoder.end_pass() if self.loop else decoder.flush()
                        except NvdecError as exc:
                            self.decode_errors += 1
                            yield DecodeError(f"NvdecError: {exc}", consecutive_errors + 1)
                            continue
                        yield from emit(decoded, started, arrival)
                        continue
                    if length_prefixed and annexb_pass != timeline.pass_index:
                        annexb = av.bitstream.BitStreamFilterContext(f"{codec}_mp4toannexb", stream)
                        annexb_pass = timeline.pass_index
                    units = annexb.filter(packet) if annexb is not None else [packet]
                    decoded = []
                    try:
                        for unit in units:
                            decoded += decoder.decode(
                                memoryview(unit), unit.pts, bool(unit.is_keyframe)
                            )
                    except NvdecError as exc:
                        self.decode_errors += 1
                        consecutive_errors += 1
                        yield DecodeError(f"NvdecError: {exc}", consecutive_errors)
                        continue
                    for item in emit(decoded, started, arrival):
                        consecutive_errors = 0
                        yield item
            finally:
                packets.close()  # ends the demuxer, which restores PyAV's "no timeout" state
        finally:
            decoder.close()


__all__ = ["DECODER_CHOICES", "DecoderChoice", "NvdecSourceReader", "select_reader"]
