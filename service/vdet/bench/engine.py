"""`vdet bench engine`: the backend alone at each batch size, random inputs, as the service
calls it (`Detector`'s backend); latency and images per second per batch."""

from __future__ import annotations

import os
import sys
import time

import numpy as np

from vdet.bench.environment import environment
from vdet.bench.stats import summarize_ms
from vdet.inference.detector import Detector


def run_engine_bench(
    model: str | os.PathLike[str],
    backend: str,
    batches: list[int],
    iterations: int = 20,
    warmup: int = 3,
    seed: int = 0,
) -> dict[str, object]:
    """The inference backend alone (no decode, pre- or postprocess): latency per call and
    images per second at each batch size, on random inputs of the model's shape.

    A batch above the backend's own maximum is split by the backend, as in the service.
    """
    if not batches or any(b < 1 for b in batches):
        raise ValueError(f"batches must be positive sizes, got {batches}")
    rng = np.random.default_rng(seed)
    runs = []
    with Detector.open(model, backend) as detector:
        info = detector.info
        h, w = info.input_hw
        for i, batch in enumerate(batches):
            _progress(i, len(batches), f"batch {batch}")
            x = rng.random((batch, 3, h, w), dtype=np.float32)
            for _ in range(warmup):
                detector.backend.infer(x)
            times = []
            for _ in range(iterations):
                started = time.perf_counter()
                detector.backend.infer(x)
                times.append(time.perf_counter() - started)
            latency = summarize_ms(times)
            runs.append(
                {
                    "batch": batch,
                    "latency_ms": latency,
                    "images_per_s": round(batch * 1e3 / latency["p50"], 2),
                }
            )
        _progress(len(batches), len(batches), "done")
        backend_name, device = detector.backend.name, detector.backend.device
        max_batch = detector.backend.max_batch
    return {
        "scenario": "engine",
        "environment": environment(),
        "backend": backend_name,
        "device": device,
        "max_batch": max_batch,
        "model": {"path": str(info.path), "sha256": info.sha256, "input_hw": [h, w]},
        "iterations": iterations,
        "runs": runs,
    }


def _progress(done: int, total: int, label: str) -> None:
    """A one-line progress bar on stderr (long runs say where they are)."""
    width = 24
    filled = width * done // max(total, 1)
    end = "\n" if done >= total else ""
    print(
        f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {label:<24}",
        end=end,
        file=sys.stderr,
        flush=True,
    )
