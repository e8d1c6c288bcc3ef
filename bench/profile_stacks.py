"""Where the CPU of a `vdet serve` goes, from py-spy's collapsed stacks (a lab tool).

    python bench/profile_stacks.py PYSPY.txt [--top 25]

The input is `py-spy record --subprocesses --format raw` of a server and its worker processes
(bench/gpu/run_session_device.sh serve with VDET_SERVE_PROFILE_S): one line per distinct stack,
`process A:"cmd";process B:"cmd";frame;frame;... COUNT`. py-spy leaves idle threads out, so a
sample is a thread on the CPU (or holding up the interpreter) at that moment.

Printed: the samples of each process role (API process, worker processes), then for the worker
processes the share of samples under each vdet function that is innermost on the stack (the
product's own code that spent the time, callees outside vdet included), and the share of each
leaf frame (where the time was spent, vdet or not).
"""

from __future__ import annotations

import argparse
import collections
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

# A process's command line may hold ';' (a multiprocessing child's `-c` code does).
_PROCESS = re.compile(r'process \d+:"(?P<cmd>[^"]*)";?')
_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^():]+)(?::\d+)?\)$")


@dataclass(frozen=True)
class Stack:
    """One line of the input: the processes from the profiled root down, frames from the
    outermost, and how many samples."""

    processes: tuple[str, ...]
    frames: tuple[str, ...]
    count: int

    @property
    def role(self) -> str:
        """`api` for the server process itself, `worker` for a process below it."""
        return "api" if len(self.processes) <= 1 else "worker"


def parse(lines: Iterable[str]) -> list[Stack]:
    stacks = []
    for line in lines:
        line = line.rstrip("\n")
        head, _, count = line.rpartition(" ")
        if not head or not count.isdigit():
            continue
        processes: list[str] = []
        while match := _PROCESS.match(head):
            processes.append(match["cmd"])
            head = head[match.end() :]
        frames = tuple(head.split(";")) if head else ()
        stacks.append(Stack(tuple(processes), frames, int(count)))
    return stacks


def frame_name(frame: str) -> str:
    """`func (path/to/module.py:12)` -> `func (module path from vdet/ or the file's name)`."""
    match = _FRAME.match(frame)
    if match is None:
        return frame
    path = match["file"]
    where = path[path.index("vdet/") :] if "vdet/" in path else Path(path).name
    return f"{match['func']} ({where})"


def innermost_vdet(frames: tuple[str, ...]) -> str:
    for frame in reversed(frames):
        match = _FRAME.match(frame)
        if match is not None and "vdet/" in match["file"]:
            return frame_name(frame)
    return "(no vdet frame)"


def shares(counts: collections.Counter[str], total: int, top: int) -> list[str]:
    return [
        f"  {count / total:6.1%}  {count:7d}  {name}" for name, count in counts.most_common(top)
    ]


def report(stacks: list[Stack], top: int) -> str:
    total = sum(s.count for s in stacks)
    if not total:
        return "no samples"
    roles: collections.Counter[str] = collections.Counter()
    for stack in stacks:
        roles[stack.role] += stack.count
    lines = [f"samples: {total}"]
    lines += shares(roles, total, top)
    for role in ("worker", "api"):
        chosen = [s for s in stacks if s.role == role]
        role_total = sum(s.count for s in chosen)
        if not role_total:
            continue
        inner: collections.Counter[str] = collections.Counter()
        leaf: collections.Counter[str] = collections.Counter()
        for stack in chosen:
            inner[innermost_vdet(stack.frames)] += stack.count
            leaf[frame_name(stack.frames[-1]) if stack.frames else "(empty)"] += stack.count
        lines += ["", f"{role}: innermost vdet function ({role_total} samples)"]
        lines += shares(inner, role_total, top)
        lines += ["", f"{role}: leaf frame"]
        lines += shares(leaf, role_total, top)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", type=Path, help="py-spy --format raw output")
    parser.add_argument("--top", type=int, default=25, help="rows per table")
    args = parser.parse_args()
    with args.profile.open() as lines:
        print(report(parse(lines), args.top))


if __name__ == "__main__":
    main()
