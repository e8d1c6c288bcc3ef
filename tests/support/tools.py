"""External programs that tests run (docker-compose, prometheus, hadolint, shellcheck).

`require_tool` finds one on PATH or beside the running Python (pip-installed tools live in the
venv's bin/, which is not on PATH when pytest is started as .venv/bin/python). Without it the
test is skipped, except under CI (``CI`` set), where it fails: CI installs the Debian packages
of ``.ci/system-packages.txt`` and the dev extra of pyproject.toml.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def find_tool(name: str) -> str | None:
    beside_python = Path(sys.executable).parent / name
    if beside_python.is_file() and os.access(beside_python, os.X_OK):
        return str(beside_python)
    return shutil.which(name)


def require_tool(name: str, *, provided_by: str) -> str:
    """The path of executable `name`; skip (fail under CI) when it is missing."""
    path = find_tool(name)
    if path is None:
        problem = f"{name} not found (install {provided_by})"
        if os.environ.get("CI"):
            pytest.fail(problem)
        pytest.skip(problem)
    return path


def docker_compose(compose_file: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Debian's docker-compose on `compose_file` (the repository as the project directory),
    with no COMPOSE_* or DOCKER_* variables of the caller: `config` needs no engine."""
    exe = require_tool("docker-compose", provided_by="Debian package docker-compose")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMPOSE_", "DOCKER_"))}
    return subprocess.run(
        [exe, "--project-directory", str(REPO), "-f", str(compose_file), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
