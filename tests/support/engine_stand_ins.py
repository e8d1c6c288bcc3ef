"""Stand-ins for the TensorRT build in CPU tests of the engine cache. None of this is TensorRT.

`StandInBuilds.write_stand_in_plan` is a real build function for `EngineCache.get_or_build`: it
writes bytes to the plan path the cache hands it, so the cache's own logic (locks, temporary
files, manifests, sha256 checks) runs for real without a GPU. `make_key` is an `EngineKey` for
an A10 and TensorRT 10.8 with fields overridable by keyword.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from vdet.tensorrt.cache import EngineKey, OptimizationProfile


def make_key(**changes: object) -> EngineKey:
    fields: dict[str, object] = {
        "gpu_name": "NVIDIA A10",
        "compute_capability": "8.6",
        "tensorrt_version": "10.8.0.43",
        "plugin_sha256": None,
        "onnx_sha256": "ab" * 32,
        "precision": "fp16",
        "profile": OptimizationProfile(1, 4, 8),
    }
    fields.update(changes)
    return EngineKey(**fields)  # type: ignore[arg-type]


class StandInBuilds:
    """A stand-in for the TensorRT build (not TensorRT): writes `payload` to the plan path."""

    def __init__(self, payload: bytes = b"stand-in plan bytes") -> None:
        self.payload = payload
        self.calls = 0
        self.lock = threading.Lock()

    def write_stand_in_plan(self, plan: Path) -> dict[str, object]:
        with self.lock:
            self.calls += 1
        time.sleep(0.01)  # long enough for racing threads to overlap
        plan.write_bytes(self.payload)
        return {"builder": "stand-in (writes a file; not TensorRT)", "calls": self.calls}
