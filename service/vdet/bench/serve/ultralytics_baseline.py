"""Ultralytics' default `predict` on the same clip, measured in the same run as the server.

A target such as "vdet processes the sample clip at >= 1.2x Ultralytics" is only meaningful
against Ultralytics measured on the same machine at the same moment. This runs
`vdet bench pipeline --baseline ultralytics` (Ultralytics' `predict` and vdet's own pipeline
alternating in blocks of frames) as its own `vdet` process, so that the benchmark client never
loads a model or Ultralytics itself; the serve benchmark runs it before and after its variants
so that the server's figures are bracketed. Failures are recorded, not raised.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Literal

from vdet.bench.serve.results import UltralyticsBaseline

_TIMEOUT_S = 900.0


def run_ultralytics_baseline(
    vdet: Path, clip: Path, model: Path | None, frames: int, when: Literal["before", "after"]
) -> UltralyticsBaseline:
    command = [str(vdet), "bench", "pipeline", "--baseline", "ultralytics", "--source", str(clip)]
    command += ["--frames", str(frames), "--warmup", "10"]
    if model is not None:
        command += ["--model", str(model)]
    load = round(os.getloadavg()[0], 2)
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return UltralyticsBaseline(when=when, frames=frames, error=f"{type(exc).__name__}: {exc}")
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        return UltralyticsBaseline(
            when=when, frames=frames, error=f"exit code {done.returncode}: {tail}"
        )
    try:
        report = json.loads(done.stdout)
        fps = report["frames_per_s"]
        return UltralyticsBaseline(
            when=when,
            frames=int(report["frames"]),
            ultralytics_fps=fps["ultralytics"],
            vdet_pipeline_fps=fps["vdet"],
            boxes_matched=report["boxes"]["ultralytics_found_by_vdet"],
            load_average_1m=load,
        )
    except (ValueError, KeyError, TypeError) as exc:
        return UltralyticsBaseline(when=when, frames=frames, error=f"unreadable output: {exc}")
