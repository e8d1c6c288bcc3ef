"""A lost H.264 reference picture, seen in the bitstream itself: `frame_num` continuity.

Whole pictures can go missing without any demuxer noticing: an RTSP camera on a lossy link
loses every RTP packet of a frame, a relay drops one, an MPEG-TS cut falls on a PES boundary.
FFmpeg's decoder then conceals the gap silently (it invents the missing reference) and NVDEC
decodes on from a picture it never had; the frames that follow are wrong until the next
keyframe. H.264 numbers reference pictures (7.4.3): a picture's `frame_num` is the previous
reference picture's (PrevRefFrameNum) or one more, modulo MaxFrameNum, unless the SPS allows
gaps. Any other value means reference pictures were lost, and the chain is damaged.

`ReferenceChain` reads just enough of each access unit for that: SPS (the frame_num width, the
gaps flag, the colour plane flag), PPS (its SPS) and the first bytes of the first slice header
(an IDR resets the count). Both decoder paths feed it their packets (Annex B or
length-prefixed). Not seen: a lost non-reference picture (nothing depends on it, nothing is
damaged), loss inside a picture (the demuxer's or decoder's signals), HEVC (no frame_num;
its pictures are counted by POC, which does not say whether one is missing), and a picture
after `memory_management_control_operation` 5, which restarts the count (reading it needs the
whole slice header; encoders cameras use do not emit it).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from vdet.ingest.bitstream import avcc_length_size

_START_CODE = b"\x00\x00\x01"
# What of a NAL unit is read: SPS and PPS whole (they are small), slices' first bytes.
_PARAMETER_SET_BYTES = 256
_SLICE_HEADER_BYTES = 40
# profile_idc values whose SPS carries chroma_format_idc, bit depths and scaling lists.
_HIGH_PROFILES = frozenset({100, 110, 122, 244, 44, 83, 86, 118, 128, 138, 139, 134, 135})
_NAL_SLICE, _NAL_IDR, _NAL_SPS, _NAL_PPS = 1, 5, 7, 8


class _Bits:
    """An RBSP read bit by bit (emulation prevention bytes removed); IndexError past its end."""

    def __init__(self, nal_payload: bytes) -> None:
        self._data = nal_payload.replace(b"\x00\x00\x03", b"\x00\x00")
        self._at = 0

    def u(self, n: int) -> int:
        value = 0
        for _ in range(n):
            byte = self._data[self._at >> 3]
            value = (value << 1) | ((byte >> (7 - (self._at & 7))) & 1)
            self._at += 1
        return value

    def ue(self) -> int:
        zeros = 0
        while self.u(1) == 0:
            zeros += 1
            if zeros > 31:
                raise ValueError("exp-Golomb code longer than 32 bits")
        return (1 << zeros) - 1 + self.u(zeros)

    def se(self) -> int:
        code = self.ue()
        return (code + 1) // 2 if code & 1 else -(code // 2)


@dataclass(frozen=True)
class H264Sps:
    """The fields of an H.264 SPS that slice headers' frame_num depends on."""

    sps_id: int
    log2_max_frame_num: int
    separate_colour_plane: bool
    gaps_allowed: bool


def parse_sps(payload: bytes) -> H264Sps | None:
    """An SPS NAL unit's payload (after its header byte), or None when it does not parse."""
    try:
        bits = _Bits(payload)
        profile = bits.u(8)
        bits.u(16)  # constraint flags, reserved bits, level_idc
        sps_id = bits.ue()
        separate = False
        if profile in _HIGH_PROFILES:
            chroma_format = bits.ue()
            if chroma_format == 3:
                separate = bool(bits.u(1))
            bits.ue()  # bit_depth_luma_minus8
            bits.ue()  # bit_depth_chroma_minus8
            bits.u(1)  # qpprime_y_zero_transform_bypass_flag
            if bits.u(1):  # seq_scaling_matrix_present_flag
                for i in range(8 if chroma_format != 3 else 12):
                    if bits.u(1):
                        _skip_scaling_list(bits, 16 if i < 6 else 64)
        log2_max_frame_num = bits.ue() + 4
        poc_type = bits.ue()
        if poc_type == 0:
            bits.ue()  # log2_max_pic_order_cnt_lsb_minus4
        elif poc_type == 1:
            bits.u(1)  # delta_pic_order_always_zero_flag
            bits.se()  # offset_for_non_ref_pic
            bits.se()  # offset_for_top_to_bottom_field
            for _ in range(bits.ue()):
                bits.se()
        bits.ue()  # max_num_ref_frames
        gaps = bool(bits.u(1))
    except (IndexError, ValueError):
        return None
    if not 4 <= log2_max_frame_num <= 16 or sps_id > 31:
        return None
    return H264Sps(sps_id, log2_max_frame_num, separate, gaps)


def _skip_scaling_list(bits: _Bits, size: int) -> None:
    last = nxt = 8
    for _ in range(size):
        if nxt != 0:
            nxt = (last + bits.se() + 256) % 256
        last = nxt if nxt != 0 else last


class ReferenceChain:
    """Follows an H.264 stream's frame_num across access units; `feed` says when one follows
    lost reference pictures. One per stream, fed in decode order; `restart` after a seek or a
    loop back (the next picture starts a new count)."""

    def __init__(self) -> None:
        self._sps: dict[int, H264Sps] = {}
        self._pps: dict[int, int] = {}  # pps id -> sps id
        self._prev_ref: int | None = None
        self.gaps = 0

    def restart(self) -> None:
        self._prev_ref = None

    def feed_annex_b(self, data: bytes) -> str | None:
        """One access unit in Annex B; a damage reason when its picture follows a gap."""
        return self._feed(_annex_b_heads(data))

    def feed_length_prefixed(self, data: bytes, extradata: bytes) -> str | None:
        """One access unit with `extradata`'s (avcC) NAL lengths, its parameter sets read
        from `extradata` first when they are not known yet."""
        if not self._sps and extradata[:1] == b"\x01":
            self._feed(_avcc_parameter_sets(extradata))
        return self._feed(_length_prefixed_heads(data, avcc_length_size(extradata)))

    def _feed(self, heads: Iterator[bytes]) -> str | None:
        for head in heads:
            kind = head[0] & 0x1F
            if kind == _NAL_SPS:
                sps = parse_sps(head[1:])
                if sps is not None:
                    self._sps[sps.sps_id] = sps
            elif kind == _NAL_PPS:
                self._parse_pps(head[1:])
            elif kind in (_NAL_SLICE, _NAL_IDR):
                return self._picture(head, kind == _NAL_IDR)  # the first slice says it all
        return None

    def _parse_pps(self, payload: bytes) -> None:
        try:
            bits = _Bits(payload)
            pps_id, sps_id = bits.ue(), bits.ue()
        except (IndexError, ValueError):
            return
        if pps_id <= 255 and sps_id <= 31:
            self._pps[pps_id] = sps_id

    def _picture(self, head: bytes, idr: bool) -> str | None:
        reference = (head[0] >> 5) & 0x03 != 0
        try:
            bits = _Bits(head[1:])
            bits.ue()  # first_mb_in_slice
            bits.ue()  # slice_type
            sps = self._sps.get(self._pps.get(bits.ue(), -1))
            if sps is None:
                return None
            if sps.separate_colour_plane:
                bits.u(2)  # colour_plane_id
            frame_num = bits.u(sps.log2_max_frame_num)
        except (IndexError, ValueError):
            return None
        previous = self._prev_ref
        if reference:
            self._prev_ref = frame_num
        if idr or previous is None or sps.gaps_allowed:
            return None
        if frame_num in (previous, (previous + 1) % (1 << sps.log2_max_frame_num)):
            return None
        self.gaps += 1
        return (
            f"reference pictures are missing from the stream (H.264 frame_num {frame_num} "
            f"after {previous})"
        )


def _annex_b_heads(data: bytes) -> Iterator[bytes]:
    """The first bytes of each NAL unit of an Annex B access unit (parameter sets whole)."""
    start = data.find(_START_CODE)
    while start >= 0:
        begin = start + len(_START_CODE)
        if begin >= len(data):
            return
        nxt = data.find(_START_CODE, begin)
        end = len(data) if nxt < 0 else nxt
        kind = data[begin] & 0x1F
        keep = _PARAMETER_SET_BYTES if kind in (_NAL_SPS, _NAL_PPS) else _SLICE_HEADER_BYTES
        yield data[begin : min(end, begin + keep)]
        if kind in (_NAL_SLICE, _NAL_IDR):
            return  # nothing after the first slice is read
        start = nxt


def _length_prefixed_heads(data: bytes, size: int) -> Iterator[bytes]:
    at = 0
    while at + size <= len(data):
        length = int.from_bytes(data[at : at + size], "big")
        at += size
        if length == 0 or at + length > len(data):
            return
        kind = data[at] & 0x1F
        keep = _PARAMETER_SET_BYTES if kind in (_NAL_SPS, _NAL_PPS) else _SLICE_HEADER_BYTES
        yield data[at : at + min(length, keep)]
        if kind in (_NAL_SLICE, _NAL_IDR):
            return
        at += length


def _avcc_parameter_sets(extradata: bytes) -> Iterator[bytes]:
    """The SPS and PPS NAL units of avcC extradata (ISO/IEC 14496-15 5.3.3.1)."""
    try:
        at = 5
        for count_mask in (0x1F, 0xFF):
            count = extradata[at] & count_mask
            at += 1
            for _ in range(count):
                length = int.from_bytes(extradata[at : at + 2], "big")
                at += 2
                yield extradata[at : at + length]
                at += length
    except IndexError:
        return


__all__ = ["H264Sps", "ReferenceChain", "parse_sps"]
