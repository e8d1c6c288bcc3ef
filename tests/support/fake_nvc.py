"""A stand-in for PyNvVideoCodec that decodes with PyAV on the CPU, for NVDEC logic tests.

It mimics the parts of PyNvVideoCodec 2.2's API that vdet.ingest.nvdec uses: `CreateDecoder`
(keyword arguments recorded), `PacketData` (bsl_data is an address, read during `Decode`),
`Decode` returning frames that support DLPack (`torch.from_dlpack` -> (h * 3 / 2, w) uint8
NV12 on the CPU; for 10- and 12-bit video uint16 P016, described with the column stride of 2
samples PyNvVideoCodec 2.2 gives it over a packed buffer) and `getPTS()`, an empty PacketData
flushing, `CreateDemuxer(filename=...)` yielding Annex B packets with key/pts, and the enums.
Frames come from FFmpeg's decoder, so their pixels are the reference ones. `fail_on` makes the
n-th Decode call raise.
"""

from __future__ import annotations

import ctypes
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import av
import av.bitstream
import numpy as np
import torch


class cudaVideoCodec:  # noqa: N801 - PyNvVideoCodec's spelling
    H264 = "H264"
    HEVC = "HEVC"


class cudaVideoChromaFormat:  # noqa: N801 - PyNvVideoCodec's spelling
    Monochrome = "400"
    YUV420 = "420"
    YUV422 = "422"
    YUV444 = "444"


# GetDecoderCaps answers, by "codec/chroma/bit depth" (tests/support/media/nvdec_caps.json).
HOPPER_CAPS: dict[str, dict[str, int]] = json.loads(
    (Path(__file__).parent / "media" / "nvdec_caps.json").read_text()
)["caps"]


class DisplayDecodeLatencyType:
    NATIVE = "NATIVE"
    LOW = "LOW"
    ZERO = "ZERO"


class VideoPacketFlag:
    ENDOFPICTURE = 1


class _Named:
    def __init__(self, name: str) -> None:
        self.name = name


class PacketData:
    def __init__(self) -> None:
        self.bsl_data = 0
        self.bsl = 0
        self.pts = 0
        self.key = 0
        self.decode_flag = 0


class _Frame:
    def __init__(self, nv12: np.ndarray, pts: int) -> None:
        tensor = torch.from_numpy(nv12)
        if tensor.dtype == torch.uint16:  # P016: PyNvVideoCodec 2.2's strides (w, 2)
            rows, w = tensor.shape
            packed = torch.zeros(rows * w + w, dtype=torch.uint16)
            packed[: rows * w] = tensor.reshape(-1)
            tensor = packed.as_strided((rows, w), (w, 2))
        self._tensor = tensor
        self._pts = pts

    def __dlpack__(self, **kwargs: Any) -> Any:
        kwargs.pop("stream", None)
        return self._tensor.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> Any:
        return self._tensor.__dlpack_device__()

    def getPTS(self) -> int:  # noqa: N802
        return self._pts


def nv12_of(frame: av.VideoFrame) -> np.ndarray:
    """The surface NVDEC would hand out for `frame`: NV12 (uint8) for 8-bit 4:2:0, P016
    (uint16, values in the high bits) for 10- and 12-bit 4:2:0."""
    bits = frame.format.components[0].bits
    if bits > 8:
        yuv = frame.reformat(format=f"yuv420p{bits}le").to_ndarray()
    else:
        yuv = frame.to_ndarray(format="yuv420p")
    h, w = frame.height, frame.width
    flat = yuv.reshape(-1)
    u = flat[h * w : h * w + (h // 2) * (w // 2)].reshape(h // 2, w // 2)
    v = flat[h * w + (h // 2) * (w // 2) :].reshape(h // 2, w // 2)
    uv = np.stack((u, v), axis=-1).reshape(h // 2, w)
    surface = np.concatenate((yuv[:h], uv), axis=0)
    if bits > 8:
        surface = (surface.astype(np.uint16) << (16 - bits)).astype(np.uint16)
    return np.ascontiguousarray(surface)


@dataclass
class Fed:
    data: bytes
    pts: int
    decode_flag: int


@dataclass
class _Session:
    owner: FakeNvc
    options: dict[str, Any]
    fed: list[Fed] = field(default_factory=list)

    def __post_init__(self) -> None:
        codec = {"H264": "h264", "HEVC": "hevc"}[self.options["codec"]]
        self._context = av.CodecContext.create(codec, "r")

    def Decode(self, packet: PacketData) -> list[_Frame]:  # noqa: N802
        self.owner.decode_calls += 1
        if self.owner.fail_on is not None and self.owner.decode_calls == self.owner.fail_on:
            raise RuntimeError("PyNvVCExceptionDecode: simulated decoder failure")
        if packet.bsl == 0:
            decoded = self._context.decode(None)
        else:
            data = ctypes.string_at(packet.bsl_data, packet.bsl)
            self.fed.append(Fed(data, int(packet.pts), int(packet.decode_flag)))
            out = av.Packet(data)
            out.pts = int(packet.pts)
            decoded = self._context.decode(out)
        return [_Frame(nv12_of(f), int(f.pts or 0)) for f in decoded]


class _Demuxer:
    def __init__(self, filename: str) -> None:
        self._container = av.open(filename)
        self._stream = self._container.streams.video[0]
        context = self._stream.codec_context
        self._codec = context.name
        self._colour = (context.colorspace, context.color_range)
        name = f"{self._codec}_mp4toannexb"
        extradata = bytes(context.extradata or b"")
        self._bsf = (
            av.bitstream.BitStreamFilterContext(name, self._stream)
            if extradata[:1] == b"\x01"
            else None
        )
        self._keep: list[np.ndarray] = []

    def GetNvCodecId(self) -> _Named:  # noqa: N802
        return _Named({"h264": "H264", "hevc": "HEVC"}[self._codec])

    def ColorSpace(self) -> _Named:  # noqa: N802
        return _Named({1: "BT_709", 5: "BT_601", 6: "BT_601"}.get(self._colour[0], "UNSPEC"))

    def ColorRange(self) -> _Named:  # noqa: N802
        return _Named({1: "MPEG", 2: "JPEG"}.get(self._colour[1], "UDEF"))

    def __iter__(self) -> Any:
        for packet in self._container.demux(self._stream):
            if packet.size == 0:
                continue
            units = self._bsf.filter(packet) if self._bsf is not None else [packet]
            for unit in units:
                buffer = np.frombuffer(bytes(unit), np.uint8)
                self._keep = [buffer]  # like the real demuxer: valid until the next packet
                pd = PacketData()
                pd.bsl_data, pd.bsl = int(buffer.ctypes.data), len(buffer)
                pd.pts, pd.key = int(unit.pts or 0), int(unit.is_keyframe)
                yield pd


class FakeNvc:
    """The module object: attributes as PyNvVideoCodec's."""

    cudaVideoCodec = cudaVideoCodec  # noqa: N815
    cudaVideoChromaFormat = cudaVideoChromaFormat  # noqa: N815
    DisplayDecodeLatencyType = DisplayDecodeLatencyType
    VideoPacketFlag = VideoPacketFlag
    PacketData = PacketData

    def __init__(
        self, fail_on: int | None = None, caps: dict[str, dict[str, int]] | None = None
    ) -> None:
        self.fail_on = fail_on
        self.caps = HOPPER_CAPS if caps is None else caps
        self.caps_asked: list[str] = []
        self.decode_calls = 0
        self.sessions: list[_Session] = []

    def CreateDecoder(self, **options: Any) -> _Session:  # noqa: N802
        self.sessions.append(_Session(self, options))
        return self.sessions[-1]

    def GetDecoderCaps(  # noqa: N802
        self, gpuid: int, codec: str, chromaformat: str, bitdepth: int
    ) -> dict[str, int]:
        key = f"{codec}/{chromaformat}/{bitdepth}"
        self.caps_asked.append(key)
        return dict(self.caps.get(key, {"supported": 0}))

    def CreateDemuxer(self, filename: str) -> _Demuxer:  # noqa: N802
        return _Demuxer(filename)
