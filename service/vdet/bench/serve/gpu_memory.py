"""GPU memory in use, from `nvidia-smi`: per device, and per process for a set of PIDs; and how
busy the GPUs' SMs and decoders are.

nvidia-smi is asked rather than NVML bound in-process so that the benchmark client makes no
CUDA or NVML state of its own on the GPU it measures. Where nvidia-smi is missing or fails
(no GPU: the CPU backend) every reading is None and the benchmark says so. Under MPS the
clients' memory may be listed under the MPS server's PID: the device total is the figure that
holds either way.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass

_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class GpuMemory:
    """One reading: every device's used MiB, and the MiB listed for the given PIDs."""

    devices: tuple[str, ...]  # "index: name, driver"
    used_mib: float  # sum over devices
    processes_mib: float  # sum over the compute processes among the given PIDs


def query(args: list[str]) -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        done = subprocess.run(
            [exe, *args, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def parse_devices(text: str) -> tuple[tuple[str, ...], float]:
    """`index, name, driver, memory.used` lines -> (descriptions, total used MiB)."""
    devices, used = [], 0.0
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4:
            continue
        index, name, driver, memory = parts
        devices.append(f"{index}: {name}, driver {driver}")
        try:
            used += float(memory)
        except ValueError:
            continue
    return tuple(devices), used


def parse_processes(text: str, pids: Iterable[int]) -> float:
    """`pid, used_memory` lines -> MiB of the listed processes that are among `pids`."""
    wanted, total = set(pids), 0.0
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 2 or not parts[0].isdigit():
            continue
        if int(parts[0]) in wanted:
            try:
                total += float(parts[1])
            except ValueError:  # "[N/A]" where the driver does not say
                continue
    return total


def read_gpu_memory(pids: Iterable[int] = ()) -> GpuMemory | None:
    """Used memory now; None without a working nvidia-smi."""
    devices_text = query(["--query-gpu=index,name,driver_version,memory.used"])
    if devices_text is None:
        return None
    devices, used = parse_devices(devices_text)
    if not devices:
        return None
    apps = query(["--query-compute-apps=pid,used_memory"]) or ""
    return GpuMemory(devices, used, parse_processes(apps, pids))


def parse_utilization(text: str) -> tuple[float, float] | None:
    """`utilization.gpu, utilization.decoder` lines (one per device) -> their means over the
    devices; None when no line parses."""
    busy, decoder = [], []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 2:
            continue
        try:
            busy.append(float(parts[0]))
            decoder.append(float(parts[1]))
        except ValueError:  # "[N/A]"
            continue
    if not busy:
        return None
    return sum(busy) / len(busy), sum(decoder) / len(decoder)


def read_utilization() -> tuple[float, float] | None:
    """(kernels busy %, decoders busy %) now, the driver's own sample of its last period;
    None without a working nvidia-smi."""
    text = query(["--query-gpu=utilization.gpu,utilization.decoder"])
    return None if text is None else parse_utilization(text)
