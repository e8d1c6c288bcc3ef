"""`vdet serve`'s embedded demo stream under a stream's `detect_fps`, windows alternated on one
server: decoded, processed, dropped and skipped frames per second and the server's CPU.

Real parts only: the installed `vdet serve` with its defaults (the demo model on the bundled
clip, paced at 30 fps, as the README's first command starts it); between windows the stream's
`detect_fps` is changed with `PATCH /v1/streams/demo`, as an operator would, and each window
reads the `vdet_frames_*_total{source="demo"}` counters from `/metrics` at its start and end.
The server's CPU is its process's user + system time over the window (`/proc`, Linux).
Settings alternate round by round, so that a shared machine's load falls on all alike.

    .venv/bin/python bench/serve_detect_fps.py --rates none 15 25 --rounds 2 --out result.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

_COUNTERS = ("decoded", "processed", "dropped", "skipped")


def _get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        body: bytes = response.read()
    return body.decode()


def _set_detect_fps(port: int, fps: float | None) -> None:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/streams/demo",
        data=json.dumps({"detect_fps": fps}).encode(),
        method="PATCH",
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        spec = json.loads(response.read())["spec"]
    if spec["detect_fps"] != fps:
        raise RuntimeError(f"the server kept detect_fps {spec['detect_fps']}, not {fps}")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _sample(port: int, pid: int) -> dict[str, float]:
    text = _get(port, "/metrics")
    sample = {"cpu_s": _cpu_seconds(pid), "t": time.monotonic()}
    for name in _COUNTERS:
        found = re.search(rf'^vdet_frames_{name}_total{{source="demo"}} (\S+)$', text, re.M)
        sample[name] = float(found.group(1)) if found else 0.0
    return sample


def _wait_ready(port: int, server: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"vdet serve exited with {server.returncode}")
        try:
            if json.loads(_get(port, "/readyz"))["ready"]:
                return
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"vdet serve not ready within {timeout_s} s")


def _commit() -> str | None:
    try:
        done = subprocess.run(
            ["git", "describe", "--always", "--dirty", "--abbrev=40"],
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).parent,
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return done.stdout.strip() or None


def _cpu_model() -> str | None:
    with open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return None


def _rate(text: str) -> float | None:
    return None if text == "none" else float(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", nargs="+", default=["none", "15", "25"], help="'none': all")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--window", type=float, default=30.0, help="measured seconds")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds after each change")
    parser.add_argument("--port", type=int, default=8017)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    rates = [_rate(text) for text in args.rates]
    vdet = Path(sys.executable).with_name("vdet")
    command = [str(vdet), "--log-level", "warning", "serve", "--port", str(args.port)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    windows: list[dict[str, Any]] = []
    try:
        _wait_ready(args.port, server, 120.0)
        time.sleep(args.settle)  # the stream's first frames, before any window
        for round_index in range(args.rounds):
            for fps in rates:
                _set_detect_fps(args.port, fps)
                time.sleep(args.settle)
                start = _sample(args.port, server.pid)
                time.sleep(args.window)
                end = _sample(args.port, server.pid)
                span = end["t"] - start["t"]
                window: dict[str, Any] = {"round": round_index, "detect_fps": fps}
                window["window_s"] = round(span, 2)
                for name in _COUNTERS:
                    window[f"{name}_per_s"] = round((end[name] - start[name]) / span, 2)
                window["server_cpu_percent"] = round(
                    (end["cpu_s"] - start["cpu_s"]) / span * 100, 1
                )
                windows.append(window)
                print(json.dumps(window), flush=True)
    finally:
        server.terminate()
        server.wait(30)
    report = {
        "benchmark": "serve-detect-fps",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "vdet_commit": _commit(),
        "machine": {
            "host_cpu": _cpu_model(),
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "command": ["vdet", "serve"],
        "options": {"window_s": args.window, "settle_s": args.settle, "rounds": args.rounds},
        "windows": windows,
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
