"""NAL units of H.264 and HEVC packets: Annex B (start codes: RTSP, MPEG-TS, what NVDEC takes)
or length-prefixed (avcC / hvcC: MP4, MKV), and the few header fields ingest reads from them.

Pure bytes in, bytes out: no FFmpeg, no GPU. vdet.ingest.nvdec feeds NVDEC with it and
vdet.ingest.reference_chain reads H.264 slice headers through it.
"""

from __future__ import annotations

from collections.abc import Iterator

_START_CODE = b"\x00\x00\x01"


def nal_units(data: bytes) -> Iterator[bytes]:
    """The NAL units of an Annex B byte stream (start codes and trailing zeros removed)."""
    start = data.find(_START_CODE)
    while start >= 0:
        begin = start + len(_START_CODE)
        nxt = data.find(_START_CODE, begin)
        end = len(data) if nxt < 0 else nxt
        unit = data[begin:end].rstrip(b"\x00") if nxt >= 0 else data[begin:end]
        if unit:
            yield unit
        start = nxt


def nal_type(unit: bytes, codec: str) -> int:
    """The NAL unit type from the first header byte (H.264: 5 bits; HEVC: 6 bits after 1)."""
    return unit[0] & 0x1F if codec == "h264" else (unit[0] >> 1) & 0x3F


_SPS_TYPE = {"h264": 7, "hevc": 33}
# Slice (VCL) NAL unit types: H.264 1-5, HEVC 0-31.
_FIRST_NON_VCL = {"h264": 6, "hevc": 32}


def sequence_header(data: bytes, codec: str) -> bytes | None:
    """The SPS NAL unit of an Annex B access unit, or None.

    Parameter sets come before an access unit's first slice (H.264 7.4.1.2.3, HEVC 7.4.2.4.4),
    so the scan stops there: every packet is checked, and most hold one slice and nothing else.
    """
    if _START_CODE not in data:
        return None
    sps, first_non_vcl = _SPS_TYPE[codec], _FIRST_NON_VCL[codec]
    for unit in nal_units(data):
        kind = nal_type(unit, codec)
        if kind == sps:
            return unit
        if kind < first_non_vcl and (codec == "hevc" or kind >= 1):
            return None
    return None


def is_length_prefixed(extradata: bytes | None) -> bool:
    """avcC / hvcC extradata (MP4, MKV): packets are length-prefixed and need the
    *_mp4toannexb bitstream filter before NVDEC's Annex B parser can read them."""
    return bool(extradata) and extradata is not None and extradata[0] == 1


def avcc_length_size(extradata: bytes) -> int:
    """The NAL length size avcC extradata declares (lengthSizeMinusOne, byte 4), 4 when it is
    too short to say."""
    return (extradata[4] & 0x03) + 1 if len(extradata) > 4 else 4


__all__ = [
    "avcc_length_size",
    "is_length_prefixed",
    "nal_type",
    "nal_units",
    "sequence_header",
]
