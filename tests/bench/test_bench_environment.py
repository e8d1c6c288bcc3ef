"""`vdet.bench.pipeline.environment()`: the machine record every benchmark's result file carries.

There is no GPU here: `nvidia-smi` is a stand-in script on PATH that prints what the real one
prints for an H200 (a line per GPU), or fails, so that the parsing is what is tested.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from vdet.bench.environment import environment, gpus

H200 = "NVIDIA H200, 580.159.04, 1980 MHz, 143771 MiB"


def _fake_nvidia_smi(folder: Path, body: str) -> None:
    script = folder / "nvidia-smi"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)


def test_gpus_and_driver_as_the_gpu_scripts_recorded_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_nvidia_smi(tmp_path, f"printf '%s\\n' '{H200}' '{H200}'")
    monkeypatch.setenv("PATH", str(tmp_path))
    # "driver" as bench/gpu/streams.py and kernels.py wrote it: one line per GPU.
    line = "580.159.04, 1980 MHz, 143771 MiB"
    assert gpus() == {"gpu": "NVIDIA H200", "driver": f"{line}\n{line}"}
    env = environment()
    assert env["gpu"] == "NVIDIA H200" and env["date"] and env["host_cpu"]


@pytest.mark.parametrize("body", ["exit 9", "echo 'No devices were found'", "true"])
def test_no_working_nvidia_smi_means_no_gpu_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str
) -> None:
    _fake_nvidia_smi(tmp_path, body)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpus() == {}
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert gpus() == {}
    assert "gpu" not in environment()
