"""Video files that exercise a decoder: the sample clip re-encoded, remuxed, damaged and cut,
and synthetic streams whose sequences change format. Used by the ingest tests and the media
robustness benchmark (bench/gpu/media_matrix.py), so both speak of the same files.

Every case made from the sample keeps its frames in order at 30 fps from the first, so frame
`i` of a case shows frame `i` of the sample (scaled to the case's size): its truth is the
sample's (vdet.modelkit.dataset.clip_truth), boxes times the scale.
"""

from __future__ import annotations

from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
from av.video.frame import PictureType

_TS_PACKET = 188
_VIDEO_PID = 256  # the PID FFmpeg's MPEG-TS muxer gives the first stream


def sample_frames(source: Path, frames: int | None = None) -> Iterator[av.VideoFrame]:
    """The decoded frames of `source`, the first `frames` of them (all: None)."""
    with av.open(str(source)) as container:
        for i, frame in enumerate(container.decode(container.streams.video[0])):
            if frames is not None and i >= frames:
                return
            yield frame


def reencode(
    source: Path,
    target: Path,
    encoder: str,
    pix_fmt: str,
    *,
    size: tuple[int, int] | None = None,
    frames: int | None = None,
    options: dict[str, str] | None = None,
    container_format: str | None = None,
    rotation: int = 0,
) -> Path:
    """`source` encoded again with `encoder` at `pix_fmt` (and `size`, scaled), 30 fps, its
    picture types the encoder's own choice (`options` set GOP and B-frames); `rotation`
    (degrees counter-clockwise) written as the container's display matrix, the pictures
    themselves stored as they are."""
    with av.open(str(target), "w", format=container_format) as out:
        stream: Any = None
        for i, frame in enumerate(sample_frames(source, frames)):
            if stream is None:
                stream = out.add_stream(encoder, rate=30)
                stream.width, stream.height = size or (frame.width, frame.height)
                stream.pix_fmt = pix_fmt
                stream.options = dict(options or {})
                if rotation:
                    stream.set_display_rotation(rotation)
            image = frame.reformat(width=stream.width, height=stream.height, format=pix_fmt)
            image.pts, image.time_base = i, Fraction(1, 30)
            # The decoder's picture types would force the source's GOP (IPPP) on the encoder:
            # no B-frames, whatever the options ask.
            image.pict_type = PictureType.NONE
            for packet in stream.encode(image):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return target


def resize_midway_ts(
    source: Path,
    target: Path,
    sizes: list[tuple[int, tuple[int, int]]],
    *,
    encoder: str = "libx264",
    frames: int | None = None,
) -> Path:
    """`source` as one H.264 stream in MPEG-TS whose size changes: `sizes` as (first frame,
    size), each run a sequence of its own (a new SPS in band, starting with a keyframe)."""
    starts = dict(sizes)
    with av.open(str(target), "w", format="mpegts") as out:
        stream: Any = None
        context: Any = None
        for i, frame in enumerate(sample_frames(source, frames)):
            if i in starts:
                if context is not None:
                    _mux_all(out, stream, context.encode(None))
                size = starts[i]
                if stream is None:
                    stream = out.add_stream(encoder, rate=30)
                    stream.width, stream.height, stream.pix_fmt = (*size, "yuv420p")
                context = _encoder(encoder, "yuv420p", size, {"bf": "0"})
            image = frame.reformat(width=context.width, height=context.height, format="yuv420p")
            image.pts, image.time_base = i, Fraction(1, 30)
            _mux_all(out, stream, context.encode(image))
        if context is not None:
            _mux_all(out, stream, context.encode(None))
    return target


def _mux_all(out: Any, stream: Any, packets: list[Any]) -> None:
    for packet in packets:
        packet.stream = stream
        out.mux(packet)


def _encoder(
    encoder: str, pix_fmt: str, size: tuple[int, int], options: dict[str, str] | None
) -> Any:
    context: Any = av.CodecContext.create(encoder, "w")
    context.width, context.height = size
    context.pix_fmt = pix_fmt
    context.time_base, context.framerate = Fraction(1, 30), Fraction(30)
    context.options = dict(options or {})
    context.open()
    return context


def remux(source: Path, target: Path, container_format: str | None = None) -> Path:
    """`source`'s video packets in another container, untouched."""
    with av.open(str(source)) as inp, av.open(str(target), "w", format=container_format) as out:
        in_stream = inp.streams.video[0]
        out_stream = out.add_stream_from_template(in_stream)
        for packet in inp.demux(in_stream):
            if packet.size:
                packet.stream = out_stream
                out.mux(packet)
    return target


def drop_frames(
    source: Path, target: Path, drop: set[int], container_format: str | None = None
) -> Path:
    """`source`'s video packets remuxed without those whose index (decode order) is in
    `drop`: whole frames lost, as when a link loses every RTP packet of a picture. The
    container is intact (no demuxer flags a gap); only the bitstream says what is missing."""
    with av.open(str(source)) as inp, av.open(str(target), "w", format=container_format) as out:
        in_stream = inp.streams.video[0]
        out_stream = out.add_stream_from_template(in_stream)
        index = 0
        for packet in inp.demux(in_stream):
            if not packet.size:
                continue
            if index not in drop:
                packet.stream = out_stream
                out.mux(packet)
            index += 1
    return target


def truncate(source: Path, target: Path, fraction: float) -> Path:
    """The first `fraction` of `source`'s bytes: a file cut off mid-transfer."""
    data = source.read_bytes()
    target.write_bytes(data[: int(len(data) * fraction)])
    return target


def write_lossy_ts(source: Path, target: Path, *, every: int = 211, after: int = 2000) -> int:
    """Remux `source` to MPEG-TS, then drop every `every`-th transport packet of the video
    after the first `after` (never one that starts a PES packet), as a lossy link would.

    The MPEG-TS demuxer sees the continuity-counter gaps and flags the packets they cut as
    corrupt; the decoder gets frames with data missing. Returns the transport packets dropped.
    """
    clean = remux(source, target.with_suffix(".clean.ts"), "mpegts")
    data = clean.read_bytes()
    clean.unlink()
    kept, dropped = [], 0
    for i in range(len(data) // _TS_PACKET):
        ts = data[i * _TS_PACKET : (i + 1) * _TS_PACKET]
        pid, starts = ((ts[1] & 0x1F) << 8) | ts[2], ts[1] & 0x40
        if pid == _VIDEO_PID and not starts and i > after and i % every == 0:
            dropped += 1
            continue
        kept.append(ts)
    target.write_bytes(b"".join(kept))
    return dropped


def write_format_sequence_ts(
    target: Path,
    parts: list[tuple[str, str]],
    *,
    frames: int = 20,
    size: tuple[int, int] = (320, 240),
) -> Path:
    """One video stream in MPEG-TS made of sequences of other formats, each `frames` long
    and starting with a keyframe: `parts` as (encoder, pixel format), e.g. 8-bit then 10-bit
    H.264 (libx264 yuv420p, then yuv420p10le). Each sequence has its own SPS in band."""
    width, height = size
    with av.open(str(target), "w", format="mpegts") as out:
        stream: Any = out.add_stream(parts[0][0], rate=30)
        stream.width, stream.height, stream.pix_fmt = width, height, parts[0][1]
        pts = 0
        for encoder, pix_fmt in parts:
            context = _encoder(encoder, pix_fmt, size, {"bf": "0", "g": str(frames)})
            for i in range(frames):
                image = np.zeros((height, width, 3), np.uint8)
                image[:, :, 1] = 60
                x = (6 * (pts + i)) % (width - 40)
                image[height // 3 : height // 3 + 40, x : x + 40] = (230, 40, 40)
                frame = av.VideoFrame.from_ndarray(image, format="rgb24").reformat(format=pix_fmt)
                frame.pts, frame.time_base = pts + i, Fraction(1, 30)
                _mux_all(out, stream, context.encode(frame))
            _mux_all(out, stream, context.encode(None))
            pts += frames
    return target


__all__ = [
    "reencode",
    "remux",
    "resize_midway_ts",
    "sample_frames",
    "truncate",
    "write_format_sequence_ts",
    "write_lossy_ts",
]
