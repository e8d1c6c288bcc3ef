"""The record of the machine every benchmark result carries: date, CPU, load, Python, GPUs and
driver, package versions (`environment`). A figure is only worth keeping with its context, and
the benchmarks of this package and the scripts of a checkout's bench/ all write this one."""

from __future__ import annotations

import datetime as dt
import os
import platform
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

# Recorded where installed: the GPU scripts' stack too (NVDEC, onnx2torch, the CUDA bindings,
# and the Ultralytics peer they measure against).
_PACKAGES = (
    "vdet",
    "numpy",
    "onnxruntime",
    "opencv-python-headless",
    "av",
    "torch",
    "torchvision",
    "onnx2torch",
    "pynvvideocodec",
    "cuda-bindings",
    "ultralytics",
)


_NVIDIA_SMI_TIMEOUT_S = 20.0


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what `platform` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpus() -> dict[str, str]:
    """The machine's NVIDIA GPUs as nvidia-smi lists them: "gpu" (the first one's name) and
    "driver" (per GPU: driver version, max SM clock, memory); {} without a working nvidia-smi.

    nvidia-smi rather than CUDA: asking creates no CUDA context in the measuring process, and
    CPU benchmarks need not import torch.
    """
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {}
    try:
        done = subprocess.run(
            [
                exe,
                "--query-gpu=name,driver_version,clocks.max.sm,memory.total",
                "--format=csv,noheader",
            ],
            capture_output=True,
            text=True,
            timeout=_NVIDIA_SMI_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return {}
    rows = [line.split(", ", 1) for line in done.stdout.strip().splitlines()]
    rows = [row for row in rows if len(row) == 2]
    if done.returncode != 0 or not rows:
        return {}
    return {"gpu": rows[0][0], "driver": "\n".join(rest for _, rest in rows)}


def environment() -> dict[str, object]:
    """Where and with what a benchmark ran: date, CPU, load, Python, the GPUs (when nvidia-smi
    lists any) and the versions of the packages that make the figures."""
    versions = {}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    cpu = cpu_model()
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host_cpu": cpu,
        "cpu_count": os.cpu_count(),
        # Other work on a shared machine moves absolute times: record how busy it was.
        "load_average_1m": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
        "platform": platform.platform(),
        **gpus(),
        "packages": versions,
    }
