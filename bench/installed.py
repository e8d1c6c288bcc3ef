"""Where a bench script finds a program the environment installed (`vdet`, `nats-server`):
beside the running interpreter (a virtual environment's bin/), else on PATH."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def installed(name: str, provided_by: str) -> str:
    """The path of `name`; exits saying what provides it when it is not there."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        raise SystemExit(f"{name} not found ({provided_by})")
    return found
