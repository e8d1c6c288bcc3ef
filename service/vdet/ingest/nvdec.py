"""NVDEC decode with PyNvVideoCodec: H.264 / HEVC packets -> NV12 / P016 frames in GPU memory.

This module owns one hardware decoder session per stream (`NvdecDecoder`), the frame type it
hands on (`GpuVideoFrame`: NV12 as a torch CUDA uint8 tensor (h * 3 / 2, w), Y rows then
interleaved UV rows, or for 10- and 12-bit video P016, the same layout in uint16, plus the
colour matrix and range the stream declares and the CUDA event after which the pixels are
valid), `nvdec_available()`, and `decode_file`, which reads a file
with PyNvVideoCodec's own demuxer (no PyAV needed). Feeding it from PyAV (RTSP, HTTP, files,
with interrupts and pacing) is vdet.ingest.nvdec_reader; this module must not import PyAV.

Facts it relies on (PyNvVideoCodec 2.2.4 and its C++ source; tests/ingest/test_ingest_nvdec_gpu.py):

- `CreateDecoder(gpuid, codec, cudacontext, cudastream, usedevicememory, latency=...)`; with
  cudacontext 0 it retains the device's primary context (the one torch uses), so a torch
  stream handle is a valid `cudastream`: the decoder's output copies run on it.
- `Decode(PacketData)` parses synchronously (the packet buffer only has to live during the
  call) and returns the frames ready for display; an empty PacketData flushes.
  `DisplayDecodeLatencyType.LOW` with `VideoPacketFlag.ENDOFPICTURE` returns each frame of an
  IPPP stream from its own packet; NATIVE (display delay, reordering) is needed with B-frames.
- A returned frame's buffer belongs to a small pool inside the decoder and is REUSED by the
  next `Decode` call (NvDecoder::Decode resets its frame counter; GetFrame hands out
  m_vpFrame[i]). `torch.from_dlpack(frame)` is a zero-copy view of that pool buffer, so each
  frame is copied once, device to device (a 1080p frame is 3 MB), into
  a tensor of its own before the next packet is decoded. `copy_frames=False` skips the copy
  for callers that finish with a frame before decoding the next packet (benchmarks).
- Inside one session a new SPS with another coded size is not output at its own size
  (NvDecoder reconfigures and scales to the first size, or throws when larger than its
  maximum). So a changed SPS starts a new session here, after flushing the old one.
- Frames of odd width or height do not occur: 4:2:0 cropping is in units of two pixels.
- 10- and 12-bit 4:2:0 video comes out as P016 (`Pixel_Format.P016`): Y rows of w uint16
  samples, then h / 2 rows of interleaved U, V, each value in the high bits, in one packed
  buffer. Its DLPack view is (h * 3 / 2, w) uint16, but PyNvVideoCodec 2.2 describes it with
  a column stride of 2 samples (ExternalBuffer::LoadDLPack takes the stride {w, 2}); the
  frames are read through a view with the packed strides (w, 1) instead, which
  tests/ingest/test_ingest_nvdec_gpu.py checks sample for sample against FFmpeg's decode.
- `GetDecoderCaps(gpuid, codec, chromaformat, bitdepth)`: `cudaVideoChromaFormat`'s members
  are named `Monochrome`, `420`, `422`, `444` (`420` is no Python identifier: reach it through
  `__members__`), `bitdepth` is the bit depth itself (8, 10); the answer is a dict (`supported`,
  `num_decoder_engines`, `width_min`/`_max`, `height_min`/`_max`, `mb_num_max`, ...). On an
  H100: H.264 4:2:0 8-bit 48x16 to 4096x4096; HEVC 4:2:0 and 4:4:4 at 8 and 10 bits to 8192.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any, ClassVar

import numpy as np
import torch
from torch.utils.dlpack import from_dlpack

from vdet.core.extras import needs_extra
from vdet.core.types import ColourMatrix, ColourRange
from vdet.cuda.capture_guard import CUDA_WORK
from vdet.cuda.cuda_stream import on_stream
from vdet.ingest.bitstream import sequence_header
from vdet.ingest.decode_choice import DecoderCaps

log = logging.getLogger(__name__)

# Codec names as FFmpeg / PyAV spell them -> PyNvVideoCodec's cudaVideoCodec member.
NVDEC_CODECS = {"h264": "H264", "hevc": "HEVC"}
# FFmpeg AVColorSpace values (libavutil/pixfmt.h).
_AVCOL_SPC_BT709, _AVCOL_SPC_SMPTE240M = 1, 7
_AVCOL_SPC_601 = frozenset({4, 5, 6})  # FCC, BT470BG, SMPTE170M
_AVCOL_SPC_BT2020 = frozenset({9, 10})
_AVCOL_RANGE_JPEG = 2


class NvdecError(RuntimeError):
    """NVDEC could not decode a packet (or create a session); the reader reports it as a
    decode error and the next keyframe starts a fresh session."""


@dataclass(frozen=True)
class GpuVideoFrame:
    """One decoded frame in GPU memory, as NVDEC ingest hands it to the GPU pipeline.

    `nv12` is (height * 3 / 2, width) uint8 on the GPU: `height` rows of Y, then `height / 2`
    rows of interleaved U, V; for `bits` > 8 (10- and 12-bit video) it is the P016 surface,
    the same layout in uint16 with each `bits`-bit value in the high bits. It is valid once
    `ready` has completed (record on `stream`);
    a consumer on another stream calls `wait(consumer_stream)` first. `matrix` and
    `colour_range` are what the stream declares (see `colour_from_metadata`). Times as in
    `VideoFrame`: `arrival_time` is the wall clock when the packet completing the frame was
    read, `decode_seconds` the host time spent decoding it.
    """

    source_id: str
    index: int
    pts_seconds: float | None
    arrival_time: float
    decode_seconds: float
    width: int
    height: int
    nv12: torch.Tensor
    matrix: ColourMatrix
    colour_range: ColourRange
    stream: torch.cuda.Stream | None
    ready: torch.cuda.Event | None
    bits: int = 8

    def __post_init__(self) -> None:
        w, h = self.width, self.height
        if w < 2 or h < 2 or w % 2 or h % 2:
            raise ValueError(f"NV12 frames have even sizes of at least 2, got {w}x{h}")
        dtype = surface_dtype(self.bits)
        if tuple(self.nv12.shape) != (h * 3 // 2, w) or self.nv12.dtype != dtype:
            raise ValueError(
                f"nv12 must be ({h * 3 // 2}, {w}) {dtype} for {self.bits}-bit samples, got "
                f"{tuple(self.nv12.shape)} {self.nv12.dtype}"
            )

    @property
    def size_wh(self) -> tuple[int, int]:
        return self.width, self.height

    @property
    def y_plane(self) -> torch.Tensor:
        return self.nv12[: self.height]

    @property
    def uv_plane(self) -> torch.Tensor:
        """(height / 2, width / 2, 2): U, V pairs."""
        return self.nv12[self.height :].reshape(self.height // 2, self.width // 2, 2)

    def wait(self, stream: torch.cuda.Stream) -> None:
        """Make `stream` wait for the pixels and keep their memory until its work is done."""
        if self.ready is not None:
            stream.wait_event(self.ready)
        if self.nv12.is_cuda:
            self.nv12.record_stream(stream)


def surface_dtype(bits: int) -> torch.dtype:
    """The sample type of a surface of `bits`-bit samples: uint8 (NV12) or uint16 (P016)."""
    if not 8 <= bits <= 16:
        raise ValueError(f"surfaces hold 8- to 16-bit samples, got {bits} bits")
    return torch.uint8 if bits == 8 else torch.uint16


@dataclass(frozen=True)
class DecodedNv12:
    """A frame as `NvdecDecoder` returns it, before the reader adds source and timing
    (`nv12` uint8, or uint16 P016 for `bits` > 8)."""

    nv12: torch.Tensor
    width: int
    height: int
    pts: int | None
    ready: torch.cuda.Event | None
    bits: int = 8


# ---------------------------------------------------------------------------- availability


def load_pynvvideocodec() -> ModuleType:
    """Import PyNvVideoCodec, or raise ImportError saying what to install."""
    try:
        module = importlib.import_module("PyNvVideoCodec")
    except ImportError as exc:
        raise ImportError(
            f"{needs_extra('NVDEC decoding (PyNvVideoCodec)', 'gpu')}, and the NVIDIA "
            f"driver's libnvcuvid on the library path: {exc}"
        ) from exc
    return module


@functools.cache
def nvdec_available(gpu: int = 0, codec: str = "h264") -> bool:
    """PyNvVideoCodec imports, torch sees a CUDA GPU, and NVDEC there decodes 8-bit 4:2:0 `codec`.

    Cached: `GetDecoderCaps` creates a CUDA context, too slow to ask per stream.
    """
    if codec not in NVDEC_CODECS:
        return False
    try:
        nvc = load_pynvvideocodec()
        if not torch.cuda.is_available() or gpu >= torch.cuda.device_count():
            return False
        # Defaults of the other arguments: 4:2:0, 8 bits.
        caps = nvc.GetDecoderCaps(gpuid=gpu, codec=getattr(nvc.cudaVideoCodec, NVDEC_CODECS[codec]))
        return bool(caps.get("supported", 0)) and int(caps.get("num_decoder_engines", 1)) > 0
    except Exception as exc:  # a missing driver library surfaces as several exception types
        log.info("NVDEC unavailable on GPU %d for %s: %s", gpu, codec, exc)
        return False


# PyNvVideoCodec's cudaVideoChromaFormat members by vdet.ingest.decode_choice's chroma names.
_CHROMA_MEMBERS = {"400": "Monochrome", "420": "YUV420", "422": "YUV422", "444": "YUV444"}


def decoder_caps(
    gpu: int, codec: str, chroma: str, bit_depth: int, *, nvc: ModuleType | None = None
) -> DecoderCaps | None:
    """What NVDEC on `gpu` reports for `codec` at a chroma format ("420", ...) and bit depth
    (`cuvidGetDecoderCaps`), or None when it cannot be asked. Cached per GPU and format (each
    question creates a CUDA context) unless `nvc` stands in for PyNvVideoCodec (tests)."""
    if nvc is not None:
        return _ask_caps(nvc, gpu, codec, chroma, bit_depth)
    return _cached_caps(gpu, codec, chroma, bit_depth)


@functools.cache
def _cached_caps(gpu: int, codec: str, chroma: str, bit_depth: int) -> DecoderCaps | None:
    try:
        nvc = load_pynvvideocodec()
    except ImportError:
        return None
    return _ask_caps(nvc, gpu, codec, chroma, bit_depth)


def _ask_caps(
    nvc: ModuleType, gpu: int, codec: str, chroma: str, bit_depth: int
) -> DecoderCaps | None:
    if codec not in NVDEC_CODECS or chroma not in _CHROMA_MEMBERS:
        return DecoderCaps(supported=False)
    name = getattr(nvc.cudaVideoCodec, NVDEC_CODECS[codec])
    member = _chroma_member(nvc, chroma)
    answers: list[DecoderCaps] = []
    # `bitdepth` is the bit depth, or (as cuvid's nBitDepthMinus8) the bit depth less 8: the
    # binding does not say which, so both are asked; only a format the GPU decodes can answer
    # "supported" to either (the other names a depth no decoder has).
    for depth in (bit_depth, bit_depth - 8) if member is not None else ():
        try:
            caps = nvc.GetDecoderCaps(gpuid=gpu, codec=name, chromaformat=member, bitdepth=depth)
        except Exception as exc:  # a missing driver library surfaces as several exception types
            log.info("NVDEC caps of GPU %d for %s %s %d-bit: %s", gpu, codec, chroma, depth, exc)
            continue
        answers.append(DecoderCaps.from_pynvvideocodec(dict(caps)))
        if answers[-1].supported:
            return answers[-1]
    if (chroma, bit_depth) == ("420", 8):
        try:  # the defaults of the other arguments are 4:2:0, 8 bits
            return DecoderCaps.from_pynvvideocodec(dict(nvc.GetDecoderCaps(gpuid=gpu, codec=name)))
        except Exception as exc:
            log.info("NVDEC caps of GPU %d for %s: %s", gpu, codec, exc)
    return answers[0] if answers else None


def _chroma_member(nvc: ModuleType, chroma: str) -> Any:
    """PyNvVideoCodec's cudaVideoChromaFormat member for "400", "420", "422" or "444", found by
    the end of its name (the binding's spelling is not documented), or None."""
    enum = getattr(nvc, "cudaVideoChromaFormat", None)
    if enum is None:
        return None
    members: dict[str, Any] = dict(getattr(enum, "__members__", None) or {})
    for name, member in members.items():
        key = name.lower()
        if (chroma == "400" and "mono" in key) or (chroma != "400" and key.endswith(chroma)):
            return member
    return getattr(enum, _CHROMA_MEMBERS[chroma], None)


# ---------------------------------------------------------------------------------- colour


def colour_from_metadata(
    colorspace: int | None, color_range: int | None, pix_fmt: str | None = None
) -> tuple[ColourMatrix, ColourRange]:
    """The matrix and range to convert with, from FFmpeg's AVColorSpace / AVColorRange values.

    BT.709 (and SMPTE 240M, within rounding of it) -> BT.709; BT.601 flavours -> BT.601;
    BT.2020 -> BT.709, the nearest this 8-bit path has (logged). Unspecified -> BT.601, which
    is what FFmpeg's swscale (the CPU path, `SourceReader`) converts untagged video with, so
    both decoders feed the network the same colours. Range: full for AVCOL_RANGE_JPEG or a
    yuvj* pixel format, else limited.
    """
    if colorspace in (_AVCOL_SPC_BT709, _AVCOL_SPC_SMPTE240M):
        matrix = ColourMatrix.BT709
    elif colorspace in _AVCOL_SPC_BT2020:
        log.info("BT.2020 video: converting with BT.709, the nearest supported matrix")
        matrix = ColourMatrix.BT709
    else:
        matrix = ColourMatrix.BT601
    full = color_range == _AVCOL_RANGE_JPEG or (pix_fmt or "").startswith("yuvj")
    return matrix, ColourRange.FULL if full else ColourRange.LIMITED


def colour_from_demuxer(demuxer: Any) -> tuple[ColourMatrix, ColourRange]:
    """Matrix and range from a PyNvVideoCodec demuxer (ColorSpace BT_601/BT_709/UNSPEC,
    ColorRange MPEG/JPEG/UDEF), with the same defaults as `colour_from_metadata`."""
    space = str(getattr(demuxer.ColorSpace(), "name", demuxer.ColorSpace()))
    colour_range = str(getattr(demuxer.ColorRange(), "name", demuxer.ColorRange()))
    matrix = ColourMatrix.BT709 if space.endswith("BT_709") else ColourMatrix.BT601
    full = colour_range.endswith("JPEG")
    return matrix, ColourRange.FULL if full else ColourRange.LIMITED


# ------------------------------------------------------------------------------- decoder


class NvdecDecoder:
    """One stream's NVDEC session(s): Annex B packets in, `DecodedNv12` frames out.

    `b_frames`: True starts in NATIVE latency (reordering), False in LOW latency (each frame
    from its own packet, ENDOFPICTURE). If a LOW session then sees a packet whose pts is
    earlier than one already fed (reordering, i.e. B-frames), it flushes and switches to
    NATIVE at the next keyframe, dropping the packets in between (`dropped_packets`).
    `header`: Annex B parameter sets (RTSP's SDP sprop sets) fed before the first packet of
    every session, for cameras that never repeat them in band. A changed SPS flushes the
    session and starts a new one (resolution changes). `stream`: the torch CUDA stream the
    decoder and the frame copies run on (default: a new one); frames' `ready` events are
    recorded on it.

    `sample_bits`: the bit depth of the stream's samples when NVDEC hands out 16-bit (P016)
    surfaces, which the reader sets from the sequence's format; unknown (None), P016 frames
    say 16 bits, which converts limited-range video exactly as its real depth would and
    full-range within a quarter of a level.

    Not thread-safe: one reader thread owns it. `nvc` replaces the PyNvVideoCodec module
    (tests); `device` "cpu" is for such tests only.

    `keep_session_across_passes` (class-wide): whether a LOW-latency session outlives the end
    of a pass over a looped file (`end_pass`); the streams benchmark turns it off to measure
    what a new session per pass costs.
    """

    keep_session_across_passes: ClassVar[bool] = True

    def __init__(
        self,
        codec: str,
        *,
        gpu: int = 0,
        b_frames: bool = False,
        header: bytes | None = None,
        stream: torch.cuda.Stream | None = None,
        copy_frames: bool = True,
        nvc: ModuleType | None = None,
        device: str | None = None,
    ) -> None:
        if codec not in NVDEC_CODECS:
            raise ValueError(f"NVDEC decodes {sorted(NVDEC_CODECS)}, not {codec!r}")
        self.codec = codec
        self.gpu = gpu
        self.b_frames = b_frames
        self.header = header or None
        self.copy_frames = copy_frames
        self._nvc = nvc if nvc is not None else load_pynvvideocodec()
        self.device = torch.device(device if device is not None else f"cuda:{gpu}")
        cuda = self.device.type == "cuda"
        if cuda and stream is None:
            stream = torch.cuda.Stream(device=self.device)  # type: ignore[no-untyped-call]
        self.stream = stream if cuda else None
        self._session: Any = None
        self._sps = sequence_header(self.header, codec) if self.header else None
        self._max_pts: int | None = None
        self._wait_for_key = False
        self._buffer: np.ndarray[Any, np.dtype[np.uint8]] | None = None
        self.sessions = 0
        self.session_create_seconds = 0.0  # summed over `sessions`
        self.dropped_packets = 0
        self.sample_bits: int | None = None

    @property
    def latency(self) -> str:
        return "native" if self.b_frames else "low"

    def _create(self) -> Any:
        nvc = self._nvc
        latency = nvc.DisplayDecodeLatencyType
        started = time.perf_counter()
        try:
            session = nvc.CreateDecoder(
                gpuid=self.gpu,
                codec=getattr(nvc.cudaVideoCodec, NVDEC_CODECS[self.codec]),
                cudacontext=0,
                cudastream=0 if self.stream is None else self.stream.cuda_stream,
                usedevicememory=True,
                latency=latency.NATIVE if self.b_frames else latency.LOW,
            )
        except Exception as exc:
            raise NvdecError(f"cannot create an NVDEC {self.codec} session: {exc}") from exc
        self.sessions += 1
        self.session_create_seconds += time.perf_counter() - started
        return session

    def decode(
        self, data: bytes | memoryview, pts: int | None = None, key: bool = False
    ) -> list[DecodedNv12]:
        """Feed one Annex B packet (a whole access unit); return the frames it completed."""
        payload = bytes(data)
        out: list[DecodedNv12] = []
        sps = sequence_header(payload, self.codec)
        if sps is not None and self._sps is not None and sps != self._sps:
            out += self.flush()  # a new sequence (size, profile): a new session
        if sps is not None:
            self._sps = sps
        starts_sequence = key or sps is not None
        if pts is not None and not self.b_frames:
            if self._max_pts is not None and pts < self._max_pts:
                log.info("packets arrive out of presentation order: decoding with reordering")
                out += self.flush()
                self.b_frames = True
                self._wait_for_key = True
            self._max_pts = pts if self._max_pts is None else max(self._max_pts, pts)
        if self._wait_for_key:
            if not starts_sequence:
                self.dropped_packets += 1
                return out
            self._wait_for_key = False
        if self._session is None:
            self._session = self._create()
            if self.header and sps is None:
                payload = self.header + payload
        out += self._feed(payload, pts)
        return out

    def flush(self) -> list[DecodedNv12]:
        """Drain and end the current session (the next packet starts a new one)."""
        self._max_pts = None  # a new session (or a loop back to the start) may restart times
        if self._session is None:
            return []
        try:
            frames = self._run(self._nvc.PacketData())
        finally:
            self._session = None
        return frames

    def end_pass(self) -> list[DecodedNv12]:
        """A looped source is back at its start: end this pass, return the frames it held.

        A LOW-latency session has returned each frame with its own packet and holds none, and
        the next pass starts at a keyframe with the same parameter sets, so the session stays
        open: a new session per pass costs a session create (`session_create_seconds`) and the
        frames the reader cannot decode meanwhile. With reordering (NATIVE) the frames held
        back for display order are drained and the session ends (`flush`).
        """
        if self.b_frames or not self.keep_session_across_passes or self._session is None:
            return self.flush()
        self._max_pts = None  # the next pass restarts its times
        return []

    def close(self) -> None:
        """End the session. Its frame pool is freed with it: zero-copy frames
        (`copy_frames=False`) must not be read after this (an illegal memory access)."""
        self._session = None

    def _feed(self, payload: bytes, pts: int | None) -> list[DecodedNv12]:
        nvc = self._nvc
        self._buffer = np.frombuffer(payload, dtype=np.uint8)  # alive through Decode()
        packet = nvc.PacketData()
        packet.bsl_data = int(self._buffer.ctypes.data)
        packet.bsl = len(payload)
        packet.pts = 0 if pts is None else int(pts)
        if not self.b_frames:
            packet.decode_flag = nvc.VideoPacketFlag.ENDOFPICTURE
        return self._run(packet, pts_known=pts is not None)

    def _run(self, packet: Any, pts_known: bool = True) -> list[DecodedNv12]:
        # Decoding and copying frames out is CUDA work that must not overlap a CUDA-graph
        # capture elsewhere in the process (vdet.cuda.capture_guard).
        with CUDA_WORK.work():
            try:
                frames = self._session.Decode(packet)
            except Exception as exc:
                self._session = None
                self._wait_for_key = True
                raise NvdecError(f"NVDEC failed on a {self.codec} packet: {exc}") from exc
            return [self._take(frame, pts_known) for frame in frames]

    def _take(self, frame: Any, pts_known: bool) -> DecodedNv12:
        with on_stream(self.stream):
            view = from_dlpack(frame)
            if (
                view.dim() != 2
                or view.dtype not in (torch.uint8, torch.uint16)
                or view.shape[0] % 3
            ):
                raise NvdecError(
                    f"expected an NV12 (uint8) or P016 (uint16) frame (h * 3 / 2, w) from "
                    f"NVDEC, got {tuple(view.shape)} {view.dtype}"
                )
            rows, width = int(view.shape[0]), int(view.shape[1])
            height = rows * 2 // 3
            bits = 8
            if view.dtype == torch.uint16:
                bits = self.sample_bits or 16
                # PyNvVideoCodec 2.2 gives P016 a column stride of 2 samples; the buffer is
                # packed rows of `width` samples (module docstring).
                view = view.as_strided((rows, width), (width, 1), view.storage_offset())
            if self.copy_frames:
                nv12 = torch.empty((rows, width), dtype=view.dtype, device=view.device)
                nv12.copy_(view, non_blocking=True)
            else:
                nv12 = view
            ready = None
            if self.stream is not None:
                ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
                ready.record(self.stream)
        pts = int(frame.getPTS()) if pts_known else None
        return DecodedNv12(nv12, width, height, pts, ready, bits)


# --------------------------------------------------------------------- files, no PyAV


def packet_bytes(packet: Any) -> bytes:
    """The payload of a PyNvVideoCodec PacketData (its buffer is reused by the next Demux)."""
    size = int(packet.bsl)
    return ctypes.string_at(int(packet.bsl_data), size) if size else b""


def detect_b_frames(pts: list[int]) -> bool:
    """Whether packets in decode order carry presentation times out of order (B-frames)."""
    highest: int | None = None
    for value in pts:
        if highest is not None and value < highest:
            return True
        highest = value if highest is None else max(highest, value)
    return False


def decode_file(
    path: str,
    *,
    source_id: str = "",
    gpu: int = 0,
    b_frames: bool | None = None,
    lookahead: int = 16,
    copy_frames: bool = True,
    stream: torch.cuda.Stream | None = None,
    nvc: ModuleType | None = None,
    on_decoder: Callable[[NvdecDecoder], None] | None = None,
) -> Iterator[GpuVideoFrame]:
    """Every frame of an MP4 / MKV / AVI file, demuxed by PyNvVideoCodec, decoded by NVDEC.

    `b_frames` None: decided from the first `lookahead` packets (presentation times out of
    decode order). Raises NvdecError on a decoder failure (a file is not retried).
    `on_decoder` sees the decoder once it exists (tests read its latency and sessions).
    """
    nvc = nvc if nvc is not None else load_pynvvideocodec()
    demuxer = nvc.CreateDemuxer(filename=str(path))
    matrix, colour_range = colour_from_demuxer(demuxer)
    codec = {"H264": "h264", "HEVC": "hevc"}.get(
        str(getattr(demuxer.GetNvCodecId(), "name", demuxer.GetNvCodecId())).rsplit(".", 1)[-1]
    )
    if codec is None:
        raise NvdecError(f"{path}: NVDEC decodes H.264 and HEVC, not {demuxer.GetNvCodecId()}")

    pending: list[tuple[bytes, int, bool]] = []
    packets = iter(demuxer)

    def next_packet() -> tuple[bytes, int, bool] | None:
        for packet in packets:
            data = packet_bytes(packet)
            if data:
                return data, int(packet.pts), bool(packet.key)
        return None

    while len(pending) < lookahead:
        item = next_packet()
        if item is None:
            break
        pending.append(item)
    if b_frames is None:
        b_frames = detect_b_frames([pts for _, pts, _ in pending])
    decoder = NvdecDecoder(
        codec, gpu=gpu, b_frames=b_frames, stream=stream, copy_frames=copy_frames, nvc=nvc
    )
    if on_decoder is not None:
        on_decoder(decoder)
    index = 0
    time_base = 1.0 / 1000.0  # PyNvVideoCodec's demuxer reports timestamps in milliseconds

    def frames_of(decoded: list[DecodedNv12], started: float) -> Iterator[GpuVideoFrame]:
        nonlocal index
        share = (time.perf_counter() - started) / max(1, len(decoded))
        for frame in decoded:
            yield GpuVideoFrame(
                source_id=source_id,
                index=index,
                pts_seconds=None if frame.pts is None else frame.pts * time_base,
                arrival_time=time.time(),
                decode_seconds=share,
                width=frame.width,
                height=frame.height,
                nv12=frame.nv12,
                matrix=matrix,
                colour_range=colour_range,
                stream=decoder.stream,
                ready=frame.ready,
                bits=frame.bits,
            )
            index += 1

    try:
        while True:
            item = pending.pop(0) if pending else next_packet()
            if item is None:
                break
            data, pts, key = item
            started = time.perf_counter()
            yield from frames_of(decoder.decode(data, pts, key), started)
        started = time.perf_counter()
        yield from frames_of(decoder.flush(), started)
    finally:
        decoder.close()


__all__ = [
    "NVDEC_CODECS",
    "DecodedNv12",
    "GpuVideoFrame",
    "NvdecDecoder",
    "NvdecError",
    "colour_from_demuxer",
    "colour_from_metadata",
    "decode_file",
    "decoder_caps",
    "detect_b_frames",
    "nvdec_available",
    "surface_dtype",
]
