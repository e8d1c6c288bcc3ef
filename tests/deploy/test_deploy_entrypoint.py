"""deploy/gpu-entrypoint.sh, run for real with stand-ins for `vdet` and `python` first on PATH.

The `vdet` stand-in records each call (its arguments and VDET_BACKEND). The `python` stand-in
answers the entrypoint's CUDA probe as told by FAKE_CUDA: `ok` (torch sees the GPU) or `broken`
(it does not, as with a driver too old for CUDA 13). A GPU is "visible" when the folder given as
NVIDIA_DEVICE_DIR holds an `nvidia0` (the real one is /dev). Nothing else is imitated.
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
exit 0
"""
FAKE_PYTHON = """#!/bin/sh
case "$FAKE_CUDA" in
    ok) exit 0 ;;
    *) echo "torch 2.14.1 (CUDA 13.0) sees no usable GPU"; exit 3 ;;
esac
"""


def run_entrypoint(
    tmp_path: Path,
    *args: str,
    gpu: bool = True,
    cuda: str = "ok",
    backend: str | None = None,
    engine_dir: Path | None = None,
    extra_env: dict[str, str] | None = None,
) -> tuple[subprocess.CompletedProcess[str], list[tuple[str, ...]]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("vdet", FAKE_VDET), ("python", FAKE_PYTHON)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    devices = tmp_path / "dev"
    devices.mkdir(exist_ok=True)
    if gpu:
        (devices / "nvidia0").write_text("")
    calls = tmp_path / "calls.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VDET_", "NVIDIA_"))}
    env.update(
        PATH=f"{bin_dir}:/usr/bin:/bin",
        CALLS=str(calls),
        FAKE_CUDA=cuda,
        NVIDIA_DEVICE_DIR=str(devices),
        NVIDIA_DRIVER_CAPABILITIES="compute,utility,video",
        VDET_ENGINE__CACHE_DIR=str(engine_dir or tmp_path / "engines"),
    )
    env.pop("ALLOW_CPU_FALLBACK", None)
    env.update(extra_env or {})
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


def test_on_a_gpu_it_serves_with_backend_auto_and_says_what_decides(tmp_path: Path) -> None:
    result, calls = run_entrypoint(tmp_path, "serve", "--port", "9000")
    assert result.returncode == 0, result.stderr
    assert calls == [("", "serve --port 9000")]  # VDET_BACKEND unset: the config's auto
    assert "GPU visible: backend auto" in result.stderr and "/readyz says which" in result.stderr
    assert (tmp_path / "engines").is_dir()
    assert "lacks 'video'" not in result.stderr


def test_a_gpu_that_cuda_cannot_use_is_refused_not_served_on_the_cpu(tmp_path: Path) -> None:
    result, calls = run_entrypoint(tmp_path, cuda="broken")
    assert result.returncode == 1
    assert calls == []
    assert "a GPU is visible but CUDA cannot use it" in result.stderr
    assert "sees no usable GPU" in result.stderr and "R580" in result.stderr
    assert "ALLOW_CPU_FALLBACK=1" in result.stderr

    result, calls = run_entrypoint(tmp_path, cuda="broken", extra_env={"ALLOW_CPU_FALLBACK": "1"})
    assert result.returncode == 0, result.stderr
    assert calls == [("onnxruntime", "serve")]


def test_without_a_gpu_it_serves_on_onnxruntime_and_says_why(tmp_path: Path) -> None:
    result, calls = run_entrypoint(tmp_path, gpu=False)
    assert result.returncode == 0, result.stderr
    assert calls == [("onnxruntime", "serve")]
    assert "no NVIDIA GPU in this container" in result.stderr


def test_missing_nvdec_and_an_unwritable_cache_are_reported(tmp_path: Path) -> None:
    (tmp_path / "not-a-dir").write_text("")  # a file where the cache folder should be
    result, calls = run_entrypoint(
        tmp_path,
        engine_dir=tmp_path / "not-a-dir" / "engines",
        extra_env={"NVIDIA_DRIVER_CAPABILITIES": "compute,utility"},
    )
    assert result.returncode == 0, result.stderr
    assert calls == [("", "serve")]
    assert "lacks 'video': NVDEC is not mounted" in result.stderr
    assert "is not writable" in result.stderr and "torch CUDA graphs will serve" in result.stderr


@pytest.mark.parametrize(
    ("args", "backend", "expected"),
    [
        (("detect", "clip.mp4"), None, [("", "detect clip.mp4")]),
        (("engine", "build", "--target", "sm86"), None, [("", "engine build --target sm86")]),
        (("serve",), "torch", [("torch", "serve")]),
    ],
)
def test_other_commands_and_an_explicit_backend_run_as_given(
    tmp_path: Path, args: tuple[str, ...], backend: str | None, expected: list[tuple[str, ...]]
) -> None:
    result, calls = run_entrypoint(tmp_path, *args, backend=backend, cuda="broken")
    assert result.returncode == 0, result.stderr
    assert calls == expected
