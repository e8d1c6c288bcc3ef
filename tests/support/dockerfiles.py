"""Just enough Dockerfile and .dockerignore reading for tests: instructions by stage, and
which paths a build context keeps (Docker's rules: patterns in order, the last match wins,
`!` re-includes, a pattern that matches a folder matches everything under it)."""

from __future__ import annotations

import fnmatch
import shutil
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, RUN, COPY, ...
    value: str  # the rest of the instruction, continuation lines joined
    stage: int  # 0 for the first FROM's stage


def instructions(path: Path) -> list[Instruction]:
    """The instructions of a Dockerfile, with comments dropped and `\\` continuations joined."""
    out: list[Instruction] = []
    stage = -1
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        full = (pending + line).strip()
        pending = ""
        if not full:
            continue
        keyword, _, value = full.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            stage += 1
        out.append(Instruction(keyword, value.strip(), stage))
    return out


def stage_count(items: list[Instruction]) -> int:
    return max(i.stage for i in items) + 1


def final_stage(items: list[Instruction]) -> list[Instruction]:
    last = stage_count(items) - 1
    return [i for i in items if i.stage == last]


def dockerignore_keeps(patterns: list[str], relative: str) -> bool:
    """Whether a build context that uses `patterns` includes `relative` (a POSIX path)."""
    keep = True
    parts = relative.split("/")
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    for pattern in patterns:
        negate = pattern.startswith("!")
        body = pattern[1:] if negate else pattern
        body = body.strip("/")
        if body == "**":
            matched = True
        elif body.startswith("**/"):
            tail = body[3:]
            matched = any(fnmatch.fnmatchcase(p, tail) for p in parts) or any(
                fnmatch.fnmatchcase(c, body) for c in candidates
            )
        else:
            matched = any(fnmatch.fnmatchcase(c, body) for c in candidates)
        if matched:
            keep = negate
    return keep


def read_dockerignore(path: Path) -> list[str]:
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def copy_context(repo: Path, sources: list[str], patterns: list[str], target: Path) -> list[str]:
    """Copy `sources` (COPY sources, relative to `repo`) into `target` as the build context
    would have them; returns the sources that the context does not contain at all."""
    missing: list[str] = []
    for source in sources:
        source = source.rstrip("/")
        origin = repo / source
        files = (
            [origin] if origin.is_file() else sorted(p for p in origin.rglob("*") if p.is_file())
        )
        kept = [f for f in files if dockerignore_keeps(patterns, f.relative_to(repo).as_posix())]
        if not kept:
            missing.append(source)
        for f in kept:
            destination = target / f.relative_to(repo)
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, destination)
    return missing
