"""One stream's decode -> detect loop without the service, measured in the same run.

On a machine shared with other work the absolute figures of a run mean little; what one bare
pipeline (`vdet bench pipeline`: the clip decoded and detected frame by frame, unpaced, no
API) reaches at the same moment is the ceiling a one-stream server can be held to. It runs as
its own `vdet` process, so the benchmark client never loads a model itself. Failures are
recorded, not raised.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from vdet.bench.serve.results import PipelineBaseline

_TIMEOUT_S = 600.0


def run_pipeline_baseline(
    vdet: Path, clip: Path, backend: str, model: Path | None, frames: int
) -> PipelineBaseline:
    command = [str(vdet), "bench", "pipeline", "--backend", backend, "--source", str(clip)]
    command += ["--frames", str(frames), "--warmup", "5"]
    if model is not None:
        command += ["--model", str(model)]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return PipelineBaseline(frames=frames, error=f"{type(exc).__name__}: {exc}")
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        return PipelineBaseline(frames=frames, error=f"exit code {done.returncode}: {tail}")
    try:
        report = json.loads(done.stdout)
        return PipelineBaseline(
            frames=frames,
            throughput_fps=report["throughput_fps"],
            latency_ms=report["latency_ms"],
            backend=report.get("backend"),
            load_average_1m=report.get("environment", {}).get("load_average_1m"),
        )
    except (ValueError, KeyError, TypeError) as exc:
        return PipelineBaseline(frames=frames, error=f"unreadable output: {exc}")
