"""Write the small clips the NVDEC tests decode, and what PyAV decodes them to.

A GPU test machine need not have PyAV (and an NVENC-less GPU such as the H200 cannot encode),
so the clips are made on any machine with PyAV's libx264 / libx265 and committed, with
`reference.json`: per clip, each frame's size and the SHA-256 of its Y plane and of its
interleaved UV plane as FFmpeg's decoder outputs them.
H.264 and HEVC decoding is bit exact, so NVDEC must reproduce every hash.

    python tests/support/media/make_nvdec_data.py          # rewrite tests/support/media/
    python tests/support/media/make_nvdec_data.py --check  # exit 1 if the committed reference is
    stale

Clips: `bframes.mp4` (H.264 with 2 B-frames: decode order != display order), `switch.h264`
(raw Annex B: 24 frames at 320x240, then a new SPS and 24 frames at 176x144; `packets` gives
each access unit's size), `hevc.mp4` (HEVC, no B-frames), and the service's own
service/vdet/assets/sample.mp4 (1080p H.264, IPPP, 300 frames; only its reference is written).
"""

from __future__ import annotations

import hashlib
import json
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np

from vdet.core.assets import asset_path

DATA = Path(__file__).resolve().parent
SAMPLE = asset_path("sample.mp4")


def _image(i: int, width: int, height: int) -> np.ndarray:
    """A gradient with two moving boxes: every frame differs, and compresses small."""
    image = np.zeros((height, width, 3), np.uint8)
    image[:, :, 0] = np.linspace(30, 200, width, dtype=np.uint8)[None, :]
    image[:, :, 1] = np.linspace(20, 150, height, dtype=np.uint8)[:, None]
    image[:, :, 2] = 90
    x = (5 * i) % max(1, width - 40)
    image[height // 4 : height // 4 + 40, x : x + 40] = (0, 0, 255)
    y = (3 * i) % max(1, height - 30)
    image[y : y + 30, width // 2 : width // 2 + 30] = (0, 255, 0)
    return image


def _encode_file(path: Path, codec: str, size: tuple[int, int], frames: int, bframes: int) -> None:
    width, height = size
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=24)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        if codec == "libx264":
            stream.options = {"bf": str(bframes), "g": "12", "preset": "superfast"}
        else:
            stream.options = {"x265-params": f"bframes={bframes}:keyint=12:log-level=error"}
        for i in range(frames):
            frame = av.VideoFrame.from_ndarray(_image(i, width, height), format="bgr24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


def _encode_annexb(size: tuple[int, int], frames: int, start: int) -> list[bytes]:
    """Access units of a fresh libx264 encoder (no B-frames, SPS/PPS in band)."""
    width, height = size
    context = av.CodecContext.create("libx264", "w")
    context.width, context.height, context.pix_fmt = width, height, "yuv420p"
    context.time_base = Fraction(1, 24)
    context.options = {"bf": "0", "g": "12", "preset": "superfast"}
    units: list[bytes] = []
    for i in range(frames):
        frame = av.VideoFrame.from_ndarray(_image(start + i, width, height), format="bgr24")
        frame.pts = i
        units += [bytes(p) for p in context.encode(frame)]
    units += [bytes(p) for p in context.encode(None)]
    return units


def _planes(frame: av.VideoFrame) -> dict[str, Any]:
    yuv = frame.to_ndarray(format="yuv420p")
    h, w = frame.height, frame.width
    y = np.ascontiguousarray(yuv[:h])
    u = yuv[h : h + h // 4].reshape(h // 2, w // 2)
    v = yuv[h + h // 4 :].reshape(h // 2, w // 2)
    uv = np.ascontiguousarray(np.stack((u, v), axis=-1).reshape(h // 2, w))
    return {
        "size": [w, h],
        "y": hashlib.sha256(y.tobytes()).hexdigest(),
        "uv": hashlib.sha256(uv.tobytes()).hexdigest(),
    }


def _reference_of_file(path: Path) -> list[dict[str, Any]]:
    with av.open(str(path)) as container:
        return [_planes(f) for f in container.decode(video=0)]


def _reference_of_units(units: list[bytes]) -> list[dict[str, Any]]:
    context = av.CodecContext.create("h264", "r")
    frames = []
    for unit in units:
        frames += [_planes(f) for f in context.decode(av.Packet(unit))]
    frames += [_planes(f) for f in context.decode(None)]
    return frames


def build(folder: Path) -> dict[str, Any]:
    """Write the clips into `folder`; return the reference (the clips' decoded hashes)."""
    folder.mkdir(parents=True, exist_ok=True)
    _encode_file(folder / "bframes.mp4", "libx264", (320, 240), 48, bframes=2)
    _encode_file(folder / "hevc.mp4", "libx265", (320, 240), 24, bframes=0)
    units = _encode_annexb((320, 240), 24, 0) + _encode_annexb((176, 144), 24, 24)
    (folder / "switch.h264").write_bytes(b"".join(units))
    return {
        "bframes.mp4": {"frames": _reference_of_file(folder / "bframes.mp4")},
        "hevc.mp4": {"frames": _reference_of_file(folder / "hevc.mp4")},
        "switch.h264": {"packets": [len(u) for u in units], "frames": _reference_of_units(units)},
        "sample.mp4": {"frames": _reference_of_file(SAMPLE)},
    }


def reference_of_committed(folder: Path) -> dict[str, Any]:
    """The reference recomputed from the clips as committed (what --check compares)."""
    data = (folder / "switch.h264").read_bytes()
    stored = json.loads((folder / "reference.json").read_text())
    sizes = stored["switch.h264"]["packets"]
    units, offset = [], 0
    for size in sizes:
        units.append(data[offset : offset + size])
        offset += size
    return {
        "bframes.mp4": {"frames": _reference_of_file(folder / "bframes.mp4")},
        "hevc.mp4": {"frames": _reference_of_file(folder / "hevc.mp4")},
        "switch.h264": {"packets": sizes, "frames": _reference_of_units(units)},
        "sample.mp4": {"frames": _reference_of_file(SAMPLE)},
    }


def main(argv: list[str]) -> int:
    if "--check" in argv:
        stored = json.loads((DATA / "reference.json").read_text())
        return 0 if reference_of_committed(DATA) == stored else 1
    reference = build(DATA)
    (DATA / "reference.json").write_text(json.dumps(reference, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
