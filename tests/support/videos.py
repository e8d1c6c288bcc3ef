"""Small H.264 clips for tests, written with PyAV's libx264: moving rectangles on a gradient.

Frame i shows a red box at x = 7 * i (mod width) and a green box moving down, so a test can
tell frames apart; the clip is short enough to write in well under a second.
"""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np


def write_h264_clip(
    path: Path,
    *,
    seconds: float = 4.0,
    fps: int = 30,
    size_wh: tuple[int, int] = (640, 360),
    bframes: int = 0,
    gop: int | None = None,
    faststart: bool = False,
) -> Path:
    """Write an H.264 MP4 (or MKV, by suffix) of `seconds` at `fps`; returns `path`.

    `bframes` is x264's ``bf``: 0 gives decode order == display order. `faststart` puts the
    index (moov) before the media data, as streaming servers do.
    """
    width, height = size_wh
    options = {"movflags": "faststart"} if faststart and path.suffix == ".mp4" else {}
    with av.open(str(path), "w", options=options) as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width = width
        stream.height = height
        stream.pix_fmt = "yuv420p"
        stream.options = {
            "bf": str(bframes),
            "g": str(gop or fps),
            "preset": "ultrafast" if bframes == 0 else "superfast",
        }
        base = np.zeros((height, width, 3), np.uint8)
        base[:, :, 0] = np.linspace(30, 120, width, dtype=np.uint8)[None, :]
        base[:, :, 1] = np.linspace(20, 90, height, dtype=np.uint8)[:, None]
        for i in range(round(seconds * fps)):
            image = base.copy()
            x = (7 * i) % (width - 80)
            image[height // 4 : height // 4 + 80, x : x + 80] = (0, 0, 255)
            y = (5 * i) % (height - 60)
            image[y : y + 60, width // 2 : width // 2 + 60] = (0, 255, 0)
            frame = av.VideoFrame.from_ndarray(image, format="bgr24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def write_corrupt_copy(source: Path, target: Path, *, seed: int = 0) -> Path:
    """Damage a faststart MP4: garbage inserted mid-file, garbage over frames, cut at 75 %.

    The index stays readable, so the file opens; packets after the insertion point are
    misaligned and several frames are overwritten, so the decoder rejects a run of them;
    the cut ends the file early without a clean end of the media data.
    """
    data = bytearray(source.read_bytes())
    rng = np.random.default_rng(seed)
    n = len(data)
    for start in (n // 5, n // 3):
        data[start : start + 3000] = rng.integers(0, 256, 3000, dtype=np.uint8).tobytes()
    middle = n // 2
    garbage = rng.integers(0, 256, 2000, dtype=np.uint8).tobytes()
    damaged = bytes(data[:middle]) + garbage + bytes(data[middle:])
    target.write_bytes(damaged[: int(len(damaged) * 0.75)])
    return target


def write_damaged_packets_copy(
    source: Path, target: Path, *, every: int = 37, first: int = 11, seed: int = 0
) -> list[int]:
    """Copy `source` packet by packet, overwriting bytes in the payload of every `every`-th
    packet from `first` on (keyframes spared), as lost or garbled network data would.

    The container stays intact, so the file opens and every packet is read; the decoder gets
    damaged slices, conceals them, and frames that reference them inherit the damage until
    the next keyframe. Returns the indexes of the damaged packets (in decode order).
    """
    rng = np.random.default_rng(seed)
    damaged: list[int] = []
    with av.open(str(source)) as inp, av.open(str(target), "w") as out:
        in_stream = inp.streams.video[0]
        out_stream = out.add_stream_from_template(in_stream)
        index = 0
        for packet in inp.demux(in_stream):
            if packet.size == 0:
                continue
            if index >= first and (index - first) % every == 0 and not packet.is_keyframe:
                data = bytearray(bytes(packet))
                positions = rng.integers(len(data) // 4, len(data), max(4, len(data) // 50))
                for pos in positions:
                    data[int(pos)] = int(rng.integers(256))
                garbled = av.Packet(bytes(data))
                garbled.pts, garbled.dts = packet.pts, packet.dts
                garbled.time_base = packet.time_base
                packet = garbled
                damaged.append(index)
            packet.stream = out_stream
            out.mux(packet)
            index += 1
    return damaged


def write_slowed_copy(source: Path, target: Path, *, frames: int, fps: int) -> Path:
    """The first `frames` frames of `source`, re-encoded (x264, near-lossless) to play at
    `fps`: a real-time stream of the same pictures at a pace the test chooses."""
    with av.open(str(source)) as reader, av.open(str(target), "w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.pix_fmt = "yuv420p"
        stream.options = {"bf": "0", "g": str(fps), "preset": "ultrafast", "crf": "12"}
        for i, picture in enumerate(reader.decode(video=0)):
            if i == frames:
                break
            if i == 0:
                stream.width, stream.height = picture.width, picture.height
            image = picture.to_ndarray(format="bgr24")
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="bgr24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return target


def decode_video_bytes(data: bytes, suffix: str = ".mp4") -> list[av.VideoFrame]:
    """Every frame of a video held in memory (a clip downloaded from the API, say)."""
    import tempfile

    with tempfile.NamedTemporaryFile(suffix=suffix) as f:
        f.write(data)
        f.flush()
        with av.open(f.name) as container:
            return list(container.decode(video=0))
