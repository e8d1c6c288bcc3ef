"""Each process's memory over a measured window, and its slope: what grows, and where.

`--memory-every S` samples, every S seconds of a step's window, the resident set (VmRSS from
/proc/PID/status: cheap, unlike the PSS the step reads at its end) of every process of the
server's tree, of each WebSocket client process and of the benchmark itself, and each one's GPU
memory (`nvidia-smi --query-compute-apps`, absent without a GPU). Processes are named by role:
`api` (the server's root), `worker w0` / `spare0` (from GET /v1/workers), `child PID` (any
other descendant), `client N`, `bench`. The slope is the least-squares line through a
process's samples, in MiB per minute, over the whole window and over its second half (what
still grows after warm-up); a soak is one long step (`--duration 1800`).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from vdet.bench.serve import gpu_memory, proctree
from vdet.bench.serve.results import ProcessTrend


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        return None
    return None


def gpu_mib_by_pid() -> dict[int, float]:
    """Used GPU memory of each compute process (empty without nvidia-smi)."""
    text = gpu_memory.query(["--query-compute-apps=pid,used_memory"]) or ""
    out: dict[int, float] = {}
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit():
            try:
                out[int(parts[0])] = out.get(int(parts[0]), 0.0) + float(parts[1])
            except ValueError:
                continue
    return out


def slope_per_minute(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, MiB) points, in MiB per minute (None: < 2 points)."""
    if len(points) < 2:
        return None
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return None
    cov = sum((t - mean_t) * (v - mean_v) for t, v in points)
    return cov / var * 60.0


@dataclass
class _Series:
    role: str
    rss: list[tuple[float, float]] = field(default_factory=list)
    gpu: list[tuple[float, float]] = field(default_factory=list)


async def sample_window(
    server_pid: int,
    client_pids: Iterable[int],
    names: Mapping[int, str],
    until: float,
    every_s: float,
) -> list[ProcessTrend]:
    """Sample every `every_s` seconds until the wall-clock time `until`; each process's trend.
    `names`: worker pids -> their names (GET /v1/workers)."""
    clients = {pid: f"client {i}" for i, pid in enumerate(client_pids)}
    series: dict[int, _Series] = {}
    start = time.time()
    while (now := time.time()) < until:
        tree = [server_pid, *proctree.descendants(server_pid)]
        roles = {pid: names.get(pid, f"child {pid}") for pid in tree}
        roles.update({server_pid: "api", **clients, os.getpid(): "bench"})
        gpu = await asyncio.to_thread(gpu_mib_by_pid)
        t = now - start
        for pid, role in roles.items():
            rss = rss_mib(pid)
            if rss is None:
                continue
            entry = series.setdefault(pid, _Series(role))
            entry.rss.append((t, rss))
            if pid in gpu:
                entry.gpu.append((t, gpu[pid]))
        await asyncio.sleep(max(0.0, min(every_s, until - time.time())))
    return [_trend(pid, s) for pid, s in sorted(series.items(), key=lambda kv: kv[1].role)]


def _trend(pid: int, s: _Series) -> ProcessTrend:
    def rounded(value: float | None) -> float | None:
        return None if value is None else round(value, 3)

    return ProcessTrend(
        role=s.role,
        pid=pid,
        samples=len(s.rss),
        rss_start_mib=round(s.rss[0][1], 1),
        rss_end_mib=round(s.rss[-1][1], 1),
        rss_slope_mib_per_min=rounded(slope_per_minute(s.rss)),
        rss_late_slope_mib_per_min=rounded(slope_per_minute(_second_half(s.rss))),
        gpu_start_mib=round(s.gpu[0][1], 1) if s.gpu else None,
        gpu_end_mib=round(s.gpu[-1][1], 1) if s.gpu else None,
        gpu_slope_mib_per_min=rounded(slope_per_minute(s.gpu)) if s.gpu else None,
        gpu_late_slope_mib_per_min=(
            rounded(slope_per_minute(_second_half(s.gpu))) if s.gpu else None
        ),
    )


def _second_half(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points of the second half of the time they span."""
    if not points:
        return []
    middle = (points[0][0] + points[-1][0]) / 2
    return [p for p in points if p[0] >= middle]


__all__ = ["gpu_mib_by_pid", "rss_mib", "sample_window", "slope_per_minute"]
