"""What event clips cost: the detection path of a paced stream through `vdet serve` with clips on
and off, alternated in one run, and the memory of a stream's pre-roll ring.

1. The installed `vdet serve` runs the bundled demo clip as a paced 30 fps camera with a zone
   over the whole frame (its busy scene makes zone events all the time), once with
   `clips.folder` set (10 s clips, 5 s pre-roll: a clip about every 10 s) and once
   without, alternating round by round. Each window reads every result of the stream over
   the WebSocket (`/v1/streams/demo/events`): results per second and the p50/p99 of their
   `end_to_end` latency (frame arrival to publish), and counts the clips written
   (`vdet_clips_total` from /metrics).
2. A 1080p30 H.264 stream at 4 Mbit/s with a keyframe every 2 s (libx264 through PyAV) is fed
   packet by packet, 1/30 s apart, to a stream's clip recorder with a 10 s pre-roll; the
   ring's bytes and the recorder's Python allocations (tracemalloc) are sampled.

    .venv/bin/python bench/clips_cost.py --rounds 3 --seconds 30 --out result.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
import urllib.request
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import yaml
from websockets.sync.client import connect

from vdet.clips.recorder import ClipRecorder, ClipWriter
from vdet.clips.store import ClipStore
from vdet.config.clips import ClipSettings
from vdet.core.assets import asset_path

ZONE = {"id": "yard", "kind": "polygon", "points": [[0, 0], [1, 0], [1, 1], [0, 1]]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        return bytes(response.read()).decode()


def _clips_written(port: int) -> float:
    total = 0.0
    for line in _get(port, "/metrics").splitlines():
        if line.startswith("vdet_clips_total{") and 'outcome="written"' in line:
            total += float(line.split()[-1])
    return total


def window(clips: bool, seconds: float, warmup: float, workdir: Path) -> dict[str, Any]:
    """One server, one window: results/s, end_to_end percentiles, clips written."""
    port = _free_port()
    config: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": port,
        "log_level": "warning",
        "sources": [
            {"id": "demo", "url": str(asset_path("sample.mp4")), "loop": True, "zones": [ZONE]}
        ],
    }
    if clips:
        config["clips"] = {
            "folder": str(workdir / "clips"),
            "pre_roll_s": 5.0,
            "post_roll_s": 2.0,
            "max_clip_s": 10.0,
        }
    path = workdir / f"vdet-{port}.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith("VDET_")}
    vdet = str(Path(sys.executable).parent / "vdet")
    server = subprocess.Popen([vdet, "serve", "--config", str(path)], env=env)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                _get(port, "/readyz")
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("vdet serve did not become ready") from None
                time.sleep(0.5)
        time.sleep(warmup)
        latencies: list[float] = []
        written_before = _clips_written(port)
        with connect(f"ws://127.0.0.1:{port}/v1/streams/demo/events") as ws:
            start = time.monotonic()
            while (left := start + seconds - time.monotonic()) > 0:
                try:
                    message = json.loads(ws.recv(timeout=left))
                except TimeoutError:
                    break
                if message.get("type") == "result":
                    latencies.append(message["result"]["timings_ms"]["end_to_end"])
            elapsed = time.monotonic() - start
        written = _clips_written(port) - written_before
    finally:
        server.terminate()
        server.wait(timeout=30)
    latencies.sort()
    return {
        "clips": clips,
        "seconds": round(elapsed, 2),
        "results_per_s": round(len(latencies) / elapsed, 2),
        "end_to_end_ms_p50": round(statistics.median(latencies), 2),
        "end_to_end_ms_p99": round(latencies[int(0.99 * (len(latencies) - 1))], 2),
        "clips_written": written,
    }


def ring_memory(workdir: Path, seconds: float = 30.0) -> dict[str, Any]:
    """The pre-roll ring of one 4 Mbit/s 1080p30 stream with a 10 s pre-roll."""
    video = workdir / "4mbit.mp4"
    frames = int(seconds * 30)
    with av.open(str(asset_path("sample.mp4"))) as source, av.open(str(video), "w") as out:
        encoder = out.add_stream("libx264", rate=30)
        encoder.width, encoder.height, encoder.pix_fmt = 1920, 1080, "yuv420p"
        encoder.bit_rate = 4_000_000
        encoder.options = {
            "preset": "veryfast",
            "g": "60",
            "keyint_min": "60",
            "sc_threshold": "0",
            "maxrate": "4M",
            "bufsize": "8M",
        }
        decoded = 0
        while decoded < frames:  # the 10 s sample, looped
            source.seek(0)
            for frame in source.decode(video=0):
                frame.pts, frame.time_base = decoded, Fraction(1, 30)
                out.mux(encoder.encode(frame))
                decoded += 1
                if decoded == frames:
                    break
        out.mux(encoder.encode(None))
    settings = ClipSettings(folder=workdir / "ring-clips", pre_roll_s=10.0, max_clip_s=20.0)
    store = ClipStore(workdir / "ring-clips", settings.max_total_bytes, settings.max_age_s)
    writer = ClipWriter(settings, store, lambda *_: None)
    tracemalloc.start()
    recorder = ClipRecorder("cam", settings, writer, ["person"])
    ring_peak = python_peak = 0
    t0 = time.time()
    bits = 0
    with av.open(str(video)) as container:
        stream = container.streams.video[0]
        for index, packet in enumerate(p for p in container.demux(stream) if p.size):
            bits += packet.size * 8
            recorder.on_packet(packet, t0 + index / 30)
            if index % 30 == 0:
                ring_peak = max(ring_peak, recorder.ring_bytes)
                python_peak = max(python_peak, tracemalloc.get_traced_memory()[0])
    tracemalloc.stop()
    writer.close()
    return {
        "stream_mbit_per_s": round(bits / seconds / 1e6, 2),
        "pre_roll_s": 10.0,
        "keyframe_every_s": 2.0,
        "ring_bytes_peak": ring_peak,
        "python_allocations_peak_bytes": python_peak,
        "budget_bytes": 8 * 1024 * 1024,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=8.0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        windows = [
            window(clips, args.seconds, args.warmup, workdir)
            for _ in range(args.rounds)
            for clips in (False, True)
        ]
        for w in windows:
            print(json.dumps(w), file=sys.stderr)
        memory = ring_memory(workdir)
    result = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "windows": windows,
        "ring": memory,
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
