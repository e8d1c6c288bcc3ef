"""CPU time and memory of a process and all its descendants, read from Linux's /proc.

A server that runs worker processes must be charged for all of them, so every figure here is
a sum over the tree under one PID at the moment of reading. Memory is given twice: RSS (what
`top` shows; pages shared between the processes count once per process) and PSS (each shared
page split between its sharers, so the sum is what the tree really holds), where the kernel
offers smaps_rollup. Processes that vanish while being read are skipped. Reads only.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")
MiB = float(1 << 20)


@dataclass(frozen=True)
class TreeSample:
    """One reading of a process tree."""

    pids: tuple[int, ...]
    identities: tuple[tuple[int, int], ...]  # (pid, start time in clock ticks): survives PID reuse
    cpu_seconds: float  # user + system of every live process in the tree
    rss_mib: float
    pss_mib: float | None  # None where any process's smaps_rollup could not be read


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    return text[text.rindex(")") + 2 :].split()


def descendants(root: int) -> list[int]:
    """`root` and every process under it (children, grandchildren, ...), root first."""
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    tree, frontier = [root], [root]
    while frontier:
        nxt = [c for pid in frontier for c in children.get(pid, [])]
        tree += nxt
        frontier = nxt
    return tree


def _pss_kib(pid: int) -> int | None:
    try:
        for line in (PROC / str(pid) / "smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def sample_tree(root: int, memory: bool = True) -> TreeSample:
    """CPU seconds and memory of `root`'s tree now (an exited root gives an empty sample).

    `memory=False` leaves PSS out (None): the kernel builds smaps_rollup by walking a
    process's whole address space under its memory-map lock, which for a CUDA process is long
    enough to hold up its threads' page faults and mappings, so a reading taken while a
    benchmark measures would be measured too."""
    pids: list[int] = []
    identities: list[tuple[int, int]] = []
    cpu_ticks = 0
    rss_pages = 0
    pss_kib: int | None = 0
    for pid in descendants(root):
        fields = _stat_fields(pid)
        if fields is None:
            continue
        # After the name: state ppid ... utime(14) stime(15) ... starttime(22) rss(24), 1-based.
        cpu_ticks += int(fields[11]) + int(fields[12])
        rss_pages += int(fields[21])
        pss = _pss_kib(pid) if memory else None
        pss_kib = None if pss is None or pss_kib is None else pss_kib + pss
        pids.append(pid)
        identities.append((pid, int(fields[19])))
    return TreeSample(
        pids=tuple(pids),
        identities=tuple(identities),
        cpu_seconds=cpu_ticks / _CLOCK_TICKS,
        rss_mib=rss_pages * _PAGE / MiB,
        pss_mib=None if pss_kib is None else pss_kib * 1024 / MiB,
    )


def process_cpu_seconds(pid: int) -> tuple[float, float] | None:
    """CPU seconds (user + system) of process `pid` alone and of its main thread (its first,
    whose thread id is the PID: where an asyncio server runs its event loop); None once it
    has gone."""
    process = _stat_fields(pid)
    main = _stat_fields_of(PROC / str(pid) / "task" / str(pid) / "stat")
    if process is None or main is None:
        return None
    ticks = (int(process[11]) + int(process[12]), int(main[11]) + int(main[12]))
    return ticks[0] / _CLOCK_TICKS, ticks[1] / _CLOCK_TICKS


def _stat_fields_of(path: Path) -> list[str] | None:
    try:
        text = path.read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def alive(identities: Iterable[tuple[int, int]]) -> list[int]:
    """The PIDs of those (pid, start time) that still run as the same process (not a zombie,
    not a new process that reused the PID)."""
    out = []
    for pid, started in identities:
        fields = _stat_fields(pid)
        if fields is not None and fields[0] != "Z" and int(fields[19]) == started:
            out.append(pid)
    return out
