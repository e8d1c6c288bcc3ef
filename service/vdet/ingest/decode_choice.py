"""Which decoder takes a stream: NVDEC when this GPU's decoder and our GPU pipeline both take
its format, else FFmpeg on the CPU, with the reason said.

A stream's format (`VideoFormat`: codec, chroma format, bit depth, coded size) is read from
FFmpeg's description of the stream when it opens and again from every new sequence header
(vdet.ingest.nvdec_reader). `choose` compares it with the decoder's capabilities
(`DecoderCaps`, what `cuvidGetDecoderCaps` reports for that codec, chroma format and bit
depth) and with the surfaces the GPU pipeline converts (`GPU_SURFACES`), and returns a
`DecodeChoice`: the path, and when it is the CPU, why, in words for the stream's status and
as a short label for metrics.

Pure logic, no GPU and no PyAV at import: the capabilities come in as data (`caps_of` is
asked per format), so the choice is tested on the CPU against recorded capabilities.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

DecodePath = Literal["nvdec", "cpu"]
# Metric labels of a choice's reason (vdet_source_decode_path{reason}).
ReasonLabel = Literal["none", "configured", "unavailable", "codec", "format", "size", "pipeline"]

# Codec names as FFmpeg spells them that the NVDEC path feeds (H.264 and HEVC Annex B).
NVDEC_PATH_CODECS = ("h264", "hevc")
# (chroma, bit depth) of the NVDEC surfaces the GPU pipeline converts: NV12 (8-bit 4:2:0) and
# P016 (10- and 12-bit 4:2:0). 4:4:4 and 4:2:2 surfaces are not converted: the CPU decodes them.
GPU_SURFACES: frozenset[tuple[str, int]] = frozenset({("420", 8), ("420", 10), ("420", 12)})
_CHROMA_NAMES = {"420": "4:2:0", "422": "4:2:2", "444": "4:4:4", "400": "monochrome"}


@dataclass(frozen=True)
class VideoFormat:
    """What a decoder must take: codec, chroma format ("420", "422", "444", "400"), luma bit
    depth and coded size."""

    codec: str
    chroma: str
    bit_depth: int
    width: int
    height: int

    def describe(self) -> str:
        chroma = _CHROMA_NAMES.get(self.chroma, self.chroma)
        return f"{self.codec} {chroma} {self.bit_depth}-bit {self.width}x{self.height}"


def format_of(codec: str, pix_fmt: str | None, width: int, height: int) -> VideoFormat | None:
    """The format of a stream FFmpeg describes by its pixel format name, or None when FFmpeg
    has not said (the pixel format unknown)."""
    if not pix_fmt:
        return None
    import av  # here: vdet.ingest.nvdec, which imports this module, must not import PyAV

    try:
        layout = av.VideoFormat(pix_fmt, 16, 16)
    except (ValueError, av.FFmpegError):
        return None
    components = layout.components
    bits = int(components[0].bits)
    if len(components) < 3 or layout.name.startswith(("gray", "ya")):
        chroma = "400"
    else:
        cw, ch = int(components[1].width), int(components[1].height)
        chroma = "444" if (cw, ch) == (16, 16) else "422" if ch == 16 else "420"
    return VideoFormat(codec, chroma, bits, int(width), int(height))


@dataclass(frozen=True)
class DecoderCaps:
    """What the GPU's decoder reports for one (codec, chroma format, bit depth)."""

    supported: bool
    min_width: int = 0
    min_height: int = 0
    max_width: int = 0
    max_height: int = 0
    max_macroblocks: int = 0  # 16x16 blocks of the coded picture; 0: no limit reported

    @classmethod
    def from_pynvvideocodec(cls, caps: dict[str, object]) -> DecoderCaps:
        """From PyNvVideoCodec's `GetDecoderCaps` dict."""

        def number(key: str) -> int:
            value = caps.get(key, 0)
            return int(value) if isinstance(value, (int, float, str)) else 0

        engines = number("num_decoder_engines") if "num_decoder_engines" in caps else 1
        return cls(
            supported=bool(number("supported")) and engines > 0,
            min_width=number("width_min"),
            min_height=number("height_min"),
            max_width=number("width_max"),
            max_height=number("height_max"),
            max_macroblocks=number("mb_num_max"),
        )


@dataclass(frozen=True)
class DecodeChoice:
    """The decoder of a stream's current sequence, and why the CPU when it is the CPU."""

    path: DecodePath
    reason: str | None = None
    label: ReasonLabel = "none"


NVDEC = DecodeChoice("nvdec")


def choose(
    fmt: VideoFormat | None,
    caps_of: Callable[[str, str, int], DecoderCaps | None],
    surfaces: frozenset[tuple[str, int]] = GPU_SURFACES,
) -> DecodeChoice:
    """NVDEC when it and the GPU pipeline take `fmt`, else the CPU and why.

    `caps_of(codec, chroma, bit_depth)` gives the decoder's capabilities (None: the driver
    could not be asked). A format FFmpeg has not described (None) goes to NVDEC: its first
    sequence header decides again.
    """
    if fmt is None:
        return NVDEC
    what = fmt.describe()
    if fmt.codec not in NVDEC_PATH_CODECS:
        why = f"{what}: the NVDEC path takes H.264 and HEVC; decoded on the CPU"
        return DecodeChoice("cpu", why, "codec")
    caps = caps_of(fmt.codec, fmt.chroma, fmt.bit_depth)
    if caps is None or not caps.supported:
        return DecodeChoice(
            "cpu",
            f"{what}: this GPU's NVDEC does not decode the format; decoded on the CPU",
            "format",
        )
    w, h = fmt.width, fmt.height
    macroblocks = ((w + 15) // 16) * ((h + 15) // 16)
    if (
        w < caps.min_width
        or h < caps.min_height
        or (caps.max_width and w > caps.max_width)
        or (caps.max_height and h > caps.max_height)
        or (caps.max_macroblocks and macroblocks > caps.max_macroblocks)
    ):
        return DecodeChoice(
            "cpu",
            f"{what}: outside this GPU's NVDEC sizes ({caps.min_width}x{caps.min_height} to "
            f"{caps.max_width}x{caps.max_height}); decoded on the CPU",
            "size",
        )
    if (fmt.chroma, fmt.bit_depth) not in surfaces:
        takes = ", ".join(f"{_CHROMA_NAMES.get(c, c)} {b}-bit" for c, b in sorted(surfaces))
        return DecodeChoice(
            "cpu",
            f"{what}: NVDEC decodes it, the GPU pipeline converts {takes} only; decoded on the CPU",
            "pipeline",
        )
    return NVDEC


__all__ = [
    "GPU_SURFACES",
    "NVDEC",
    "NVDEC_PATH_CODECS",
    "DecodeChoice",
    "DecodePath",
    "DecoderCaps",
    "ReasonLabel",
    "VideoFormat",
    "choose",
    "format_of",
]
