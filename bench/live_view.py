"""What a live viewer costs: detection throughput of the other streams with and without one.

Starts `vdet serve` (CPU, ONNX Runtime, the demo model) with two streams of the bundled
1080p30 sample clip, `demo` and `other`, both paced in real time, then alternates phases with
no viewer and with one viewer of `demo` reading live.mjpeg the way the web page asks for it
(fps=15, boxes=false, max_width=960). Per phase it records each stream's detection rate (from
frames_processed), the viewer's frames per second, the server's CPU seconds and the live
encode time (vdet_live_encode_seconds). Phases alternate (off, on, off, on, ...) so that a
machine whose load drifts affects both sides alike; one ratio compares the medians, the other
(bracketed) each phase with a viewer to the mean of the two without one around it.

With `--browser`, a last phase opens the page in headless Chromium (Debian's) and reads the
frame rate the page itself draws, how far behind live it shows frames (it holds each until its
detections have come) and how many frames older than the picture its boxes are (the browser's
own CPU use is then part of the machine's load, so that phase is reported apart).

    .venv/bin/python bench/live_view.py --out bench/results/DATE-live-view-cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import yaml

from vdet.bench.environment import environment
from vdet.core.assets import asset_path

QUERY = {"fps": "15", "boxes": "false", "max_width": "960"}
# Debian's Chromium as the web page's tests run it: Playwright itself passes --headless,
# --no-sandbox, --no-first-run and keeps background networking, component updates and sync
# off; these two it does not (no GPU process, no QUIC attempts a sandboxed host refuses).
CHROMIUM_ARGS = ["--disable-gpu", "--disable-quic"]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _metric(base: str, name: str) -> float:
    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise KeyError(name)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _processed(base: str) -> dict[str, int]:
    streams = _get_json(base + "/v1/streams")["streams"]
    return {s["id"]: int(s["status"]["frames_processed"]) for s in streams}


class Viewer(threading.Thread):
    """Reads live.mjpeg and counts complete parts, without decoding them."""

    def __init__(self, base: str) -> None:
        super().__init__(daemon=True)
        self.url = base + "/v1/streams/demo/live.mjpeg"
        self.frames = 0
        self.stop = threading.Event()

    def run(self) -> None:
        with httpx.stream("GET", self.url, params=QUERY, timeout=30) as r:
            r.raise_for_status()
            for chunk in r.iter_bytes():
                self.frames += chunk.count(b"--vdetframe\r\n")
                if self.stop.is_set():
                    return


def _phase(base: str, pid: int, seconds: float, viewer: bool) -> dict[str, Any]:
    v = Viewer(base) if viewer else None
    if v is not None:
        v.start()
        time.sleep(2.0)  # the first frames and the encoder threads start
    before, cpu0, t0 = _processed(base), _cpu_seconds(pid), time.monotonic()
    enc_n0 = _metric(base, "vdet_live_encode_seconds_count")
    enc_s0 = _metric(base, "vdet_live_encode_seconds_sum")
    frames0 = v.frames if v is not None else 0
    time.sleep(seconds)
    after, cpu1, t1 = _processed(base), _cpu_seconds(pid), time.monotonic()
    frames1 = v.frames if v is not None else 0
    enc_n = _metric(base, "vdet_live_encode_seconds_count") - enc_n0
    enc_s = _metric(base, "vdet_live_encode_seconds_sum") - enc_s0
    if v is not None:
        v.stop.set()
        v.join(timeout=10)
    elapsed = t1 - t0
    return {
        "viewer": viewer,
        "seconds": round(elapsed, 2),
        "detect_fps": {k: round((after[k] - before[k]) / elapsed, 2) for k in after},
        "viewer_fps": round((frames1 - frames0) / elapsed, 2) if viewer else None,
        "server_cpu_cores": round((cpu1 - cpu0) / elapsed, 3),
        "encodes": int(enc_n),
        "encode_ms_mean": round(1000 * enc_s / enc_n, 2) if enc_n else None,
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


def _browser_phase(base: str, seconds: float, profile: Path) -> dict[str, Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile),
            executable_path="/usr/bin/chromium",
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": 1280, "height": 900},
        )
        page = context.new_page()
        page.goto(base + "/")
        page.wait_for_function("() => Number(document.querySelector('#live').dataset.fps) > 0")
        samples, delays, older = [], [], []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(1.0)
            data = page.evaluate("({...document.querySelector('#live').dataset})")
            samples.append(float(data["fps"]))
            delays.append(float(data["delay"]))
            older.append(int(data["older"]))
        context.close()
    return {
        "page_fps_median": statistics.median(samples),
        "page_fps_samples": samples,
        # How far behind live the page shows frames so that their detections have come, and
        # how many frames before the frame shown its boxes were detected (sampled once a
        # second).
        "page_delay_ms_median": statistics.median(delays),
        "page_delay_ms_samples": delays,
        "boxes_frames_before_median": statistics.median(older),
        "boxes_frames_before_samples": older,
    }


def _cpu_costs(frames: int, width: int, quality: int) -> dict[str, Any]:
    """CPU milliseconds per 1080p frame of the sample clip: decode, and the live encode.

    CPU time, not wall time: on a shared machine, other work stretches wall times but not the
    CPU a step itself burns. Each step runs alone here, before the server starts. (Detection
    is left out: ONNX Runtime's threads spin while they wait, so its CPU time says more about
    the machine's load than about the model.)
    """
    import av

    from vdet.streams.pictures import encode_frame

    decode_ms, images = [], []
    with av.open(str(asset_path("sample.mp4"))) as container:
        t = time.process_time()
        for frame in container.decode(video=0):
            images.append(frame.to_ndarray(format="bgr24").astype(np.uint8, copy=False))
            now = time.process_time()
            decode_ms.append(1000 * (now - t))
            t = now
            if len(images) == frames:
                break
    encode_ms = []
    for image in images:
        t = time.process_time()
        encode_frame(image, None, (), quality=quality, max_width=width)
        encode_ms.append(1000 * (time.process_time() - t))
    return {
        "frames": len(images),
        "decode_cpu_ms_median": round(statistics.median(decode_ms), 2),
        "live_encode_cpu_ms_median": round(statistics.median(encode_ms), 2),
    }


def _modelled(costs: dict[str, Any], cores: int) -> dict[str, Any]:
    """What one viewer at the page's frame rate takes from detection on a machine saturated
    by it.

    With every core busy, two real-time 1080p30 streams first cost their decoding; detection
    gets the rest. A viewer's encodes come out of that rest, so detection throughput drops
    by the viewer's share of it.
    """
    fps = float(QUERY["fps"])
    decode_cores = 2 * 30 * costs["decode_cpu_ms_median"] / 1000
    viewer_cores = fps * costs["live_encode_cpu_ms_median"] / 1000
    left_for_detection = cores - decode_cores
    return {
        "cores": cores,
        "decode_cores_two_streams": round(decode_cores, 3),
        "viewer_fps": fps,
        "viewer_cores": round(viewer_cores, 4),
        "detection_throughput_ratio_with_viewer": round(1 - viewer_cores / left_for_detection, 4),
    }


def _bracketed_ratios(phases: list[dict[str, Any]], stream: str) -> list[float]:
    """`stream`'s detection rate in each phase with a viewer over the mean of its neighbours
    without one (the one before, and the one after where there is one)."""
    ratios = []
    for i, phase in enumerate(phases):
        if not phase["viewer"]:
            continue
        around = [
            p["detect_fps"][stream]
            for p in phases[max(0, i - 1) : i + 2]
            if not p["viewer"] and p is not phase
        ]
        if around:
            ratios.append(phase["detect_fps"][stream] / statistics.fmean(around))
    return ratios


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--pairs", type=int, default=4, help="(off, on) phase pairs")
    parser.add_argument("--seconds", type=float, default=20.0, help="per phase")
    parser.add_argument("--browser", action="store_true", help="add a phase with the page")
    parser.add_argument("--note", default="", help="what to know about this run")
    args = parser.parse_args()

    costs = _cpu_costs(60, int(QUERY["max_width"]), quality=75)
    print(f"cpu costs: {costs}", file=sys.stderr)
    sample = str(asset_path("sample.mp4"))
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    config = {
        "host": "127.0.0.1",
        "port": port,
        "log_level": "warning",
        "sources": [
            {"id": "demo", "url": sample, "loop": True, "realtime": True},
            {"id": "other", "url": sample, "loop": True, "realtime": True},
        ],
    }
    with tempfile.TemporaryDirectory() as tmp:
        config_path = Path(tmp) / "vdet.yaml"
        config_path.write_text(yaml.safe_dump(config))
        vdet = str(Path(sys.executable).parent / "vdet")
        env = {k: v for k, v in os.environ.items() if not k.startswith("VDET_")}
        server = subprocess.Popen([vdet, "serve", "--config", str(config_path)], env=env)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if _get_json(base + "/readyz")["ready"]:
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("vdet did not become ready")
                time.sleep(0.5)
            time.sleep(5.0)  # warm-up: both streams decoding and detecting
            phases = []
            for i in range(args.pairs):
                for viewer in (False, True):
                    phase = _phase(base, server.pid, args.seconds, viewer)
                    phases.append(phase)
                    print(f"pair {i}: {phase}", file=sys.stderr)
            # A last phase without a viewer, so that every phase with one has two neighbours.
            phases.append(_phase(base, server.pid, args.seconds, False))
            print(f"last: {phases[-1]}", file=sys.stderr)
            browser = None
            if args.browser:
                browser = _browser_phase(base, args.seconds, Path(tmp) / "profile")
                print(f"browser: {browser}", file=sys.stderr)
        finally:
            server.terminate()
            server.wait(timeout=30)

    def med(viewer: bool, key: str, stream: str | None = None) -> float:
        values = [(p[key][stream] if stream else p[key]) for p in phases if p["viewer"] is viewer]
        return float(statistics.median(values))

    other_off, other_on = med(False, "detect_fps", "other"), med(True, "detect_fps", "other")
    bracketed = _bracketed_ratios(phases, "other")
    report = {
        "scenario": "live-view",
        "environment": environment(),
        "note": args.note,
        "setup": {
            "backend": "onnxruntime (CPU), the demo model",
            "streams": "demo and other: the bundled 1080p30 sample clip, looped, real time",
            "viewer": "one reader of /v1/streams/demo/live.mjpeg, "
            + "&".join(f"{k}={v}" for k, v in QUERY.items()),
            "phases": f"{args.pairs} pairs of (no viewer, one viewer) and one without, "
            f"{args.seconds:g} s each",
        },
        "phases": phases,
        "summary": {
            "viewer_fps_median": med(True, "viewer_fps"),
            "demo_detect_fps_median": {
                "off": med(False, "detect_fps", "demo"),
                "on": med(True, "detect_fps", "demo"),
            },
            "other_detect_fps_median": {"off": other_off, "on": other_on},
            "other_throughput_ratio_on_vs_off": round(other_on / other_off, 4),
            # Each phase with a viewer against the mean of the phases without one on either
            # side of it: a load that drifts through the run cancels out.
            "other_throughput_ratio_bracketed": {
                "median": round(statistics.median(bracketed), 4),
                "each": [round(r, 4) for r in bracketed],
            },
            "server_cpu_cores_median": {
                "off": med(False, "server_cpu_cores"),
                "on": med(True, "server_cpu_cores"),
            },
            "viewer_cpu_cores": round(
                med(True, "server_cpu_cores") - med(False, "server_cpu_cores"), 3
            ),
            "encode_ms_mean_median": med(True, "encode_ms_mean"),
        },
        "browser": browser,
        "cpu_costs": costs,
        "modelled": _modelled(costs, os.cpu_count() or 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report["summary"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
