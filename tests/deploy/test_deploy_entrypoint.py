"""deploy/gpu-entrypoint.sh, run for real with a stand-in `vdet` first on PATH.

The stand-in records each call (its arguments and VDET_BACKEND) and answers `vdet engine ...`
as told by FAKE_ENGINE: `absent` (exit 2, as argparse does for an unknown command), `fails`
(the build exits 1) or `ok`.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from support.tools import REPO

SCRIPT = REPO / "deploy/gpu-entrypoint.sh"

FAKE_VDET = """#!/bin/sh
printf '%s|%s\\n' "${VDET_BACKEND:-}" "$*" >> "$CALLS"
if [ "${1:-}" = engine ]; then
    case "$FAKE_ENGINE" in
        absent) echo "vdet: error: argument command: invalid choice: 'engine'" >&2; exit 2 ;;
        fails) [ "${2:-}" = build ] && { echo "engine build exploded" >&2; exit 1; } ;;
    esac
fi
exit 0
"""


def run_entrypoint(
    tmp_path: Path,
    engine: str,
    *args: str,
    backend: str | None = None,
    engine_dir: Path | None = None,
) -> tuple[subprocess.CompletedProcess[str], list[tuple[str, ...]]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "vdet"
    fake.write_text(FAKE_VDET)
    fake.chmod(0o755)
    calls = tmp_path / "calls.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith("VDET_")}
    env.update(
        PATH=f"{bin_dir}:/usr/bin:/bin",
        CALLS=str(calls),
        FAKE_ENGINE=engine,
        ENGINE_DIR=str(engine_dir or tmp_path / "engines"),
    )
    if backend is not None:
        env["VDET_BACKEND"] = backend
    result = subprocess.run(
        ["/bin/sh", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=False,
    )
    recorded = calls.read_text().splitlines() if calls.exists() else []
    return result, [tuple(line.split("|", 1)) for line in recorded]


def test_without_vdet_engine_it_serves_on_onnxruntime_and_says_why(tmp_path: Path) -> None:
    result, calls = run_entrypoint(tmp_path, "absent")
    assert result.returncode == 0, result.stderr
    assert calls == [("", "engine --help"), ("onnxruntime", "serve")]
    assert "'vdet engine' is not available in this vdet" in result.stderr
    assert "invalid choice: 'engine'" in result.stderr
    assert "serving with the onnxruntime backend" in result.stderr


def test_a_failed_engine_build_falls_back_to_onnxruntime(tmp_path: Path) -> None:
    result, calls = run_entrypoint(tmp_path, "fails", "serve", "--port", "9000")
    assert result.returncode == 0, result.stderr
    engines = tmp_path / "engines"
    assert calls == [
        ("", "engine --help"),
        ("", f"engine build --cache-dir {engines}"),
        ("onnxruntime", "serve --port 9000"),
    ]
    assert "'vdet engine build' failed" in result.stderr


def test_a_built_engine_serves_on_tensorrt(tmp_path: Path) -> None:
    result, calls = run_entrypoint(tmp_path, "ok")
    assert result.returncode == 0, result.stderr
    assert calls[-1] == ("tensorrt", "serve")
    assert (tmp_path / "engines").is_dir()
    assert "serving with the tensorrt backend" in result.stderr


def test_an_unusable_engine_cache_falls_back(tmp_path: Path) -> None:
    # A regular file where the cache folder should be: not creatable, even by root.
    (tmp_path / "not-a-dir").write_text("")
    result, calls = run_entrypoint(tmp_path, "ok", engine_dir=tmp_path / "not-a-dir" / "engines")
    assert result.returncode == 0, result.stderr
    assert calls == [("", "engine --help"), ("onnxruntime", "serve")]
    assert "is not writable" in result.stderr


@pytest.mark.parametrize(
    ("args", "backend", "expected"),
    [
        (("detect", "clip.mp4"), None, [("", "detect clip.mp4")]),
        (("serve",), "onnxruntime", [("onnxruntime", "serve")]),
    ],
)
def test_other_commands_and_an_explicit_backend_run_as_given(
    tmp_path: Path, args: tuple[str, ...], backend: str | None, expected: list[tuple[str, ...]]
) -> None:
    result, calls = run_entrypoint(tmp_path, "ok", *args, backend=backend)
    assert result.returncode == 0, result.stderr
    assert calls == expected
