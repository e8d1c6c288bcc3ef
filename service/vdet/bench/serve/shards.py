"""The hand-made shards of the GPU benchmark harness, run beside `vdet serve` at the same N.

`bench/gpu/streams.py` (a source checkout's, GPU only) assembles the stream manager by hand in
several processes with no API; it is what `vdet serve` must catch up with. This module only
invokes it as a subprocess, one paced run per stream count (`vdet:N:p:<options>`), and keeps
its runs as it wrote them. Its latency is packet -> published inside the process, not -> a
WebSocket client, and it loops the sample clip whatever `--clip` says.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vdet.bench.serve.results import ShardsResult

_RUN_OVERHEAD_S = 200.0  # the harness's own per-run timeout is 150 s + the window
_KEPT = (
    "name",
    "system",
    "sources",
    "paced",
    "batch",
    "processes",
    "mps",
    "duration_s",
    "fps_aggregate",
    "fps_per_source",
    "dropped",
    "drop_rate",
    "latency_ms",
    "gpu_memory_mib",
    "cpu_percent",
    "rss_mib",
    "error",
)


def harness_run(streams: int, options: str) -> str:
    """The harness's run spec: paced `vdet` at `streams`, processes capped at `streams`."""
    parts = []
    for option in (o for o in options.split(":") if o):
        if option.startswith("x") and option[1:].isdigit():
            processes = min(int(option[1:]), streams)
            if processes <= 1:
                continue
            option = f"x{processes}"
        parts.append(option)
    return ":".join(["vdet", str(streams), "p", *parts])


def harness_command(
    script: Path, streams: list[int], seconds: float, options: str, out: Path
) -> list[str]:
    runs = " ".join(harness_run(n, options) for n in streams)
    return [
        sys.executable,
        str(script),
        "--runs",
        runs,
        "--seconds",
        str(seconds),
        "--no-peers",
        "--out",
        str(out),
    ]


def run_shards(script: Path, streams: list[int], seconds: float, options: str) -> ShardsResult:
    """Run the harness and keep its runs' headline fields; failures are recorded, not raised."""
    with tempfile.TemporaryDirectory(prefix="vdet-bench-shards-") as tmp:
        out = Path(tmp) / "streams.json"
        command = harness_command(script, streams, seconds, options, out)
        started = time.monotonic()
        error = None
        returncode: int | None = None
        try:
            done = subprocess.run(
                command,
                timeout=len(streams) * (seconds + _RUN_OVERHEAD_S),
                check=False,
                stdout=2,  # its progress lines on our stderr, beside ours
            )
            returncode = done.returncode
        except subprocess.TimeoutExpired:
            error = "the harness did not finish in time"
        except OSError as exc:
            error = f"cannot run the harness: {exc}"
        runs = []
        try:
            report = json.loads(out.read_text())
            runs = [{k: r[k] for k in _KEPT if k in r} for r in report.get("runs", [])]
        except (OSError, ValueError, AttributeError) as exc:
            error = error or f"no result from the harness ({type(exc).__name__}: {exc})"
        return ShardsResult(
            command=command,
            returncode=returncode,
            seconds=round(time.monotonic() - started, 1),
            runs=runs,
            error=error,
        )
