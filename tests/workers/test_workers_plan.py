"""Worker planning (how many processes, on which GPU) and MPS start-up, without a GPU."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vdet.config.base import ConfigError
from vdet.config.settings import Settings, load_settings
from vdet.workers import mps
from vdet.workers.plan import child_visible_devices, plan_workers, stream_capacity


def settings(**values: object) -> Settings:
    return Settings(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("values", "gpus", "expected"),
    [
        # One process: max_streams.
        ({"max_streams": 12}, 0, 12),
        # Worker processes: their shares, when smaller.
        ({"max_streams": 12, "workers": {"processes": 2, "streams_per_process": 4}}, 0, 8),
        ({"max_streams": 6, "workers": {"processes": 2, "streams_per_process": 4}}, 0, 6),
        # GPUs: the per-GPU cap over the GPUs the workers use.
        ({"max_streams": 64, "gpu": {"max_streams_per_gpu": 20}}, 2, 40),
        ({"max_streams": 64, "gpu": {"max_streams_per_gpu": 20}}, 4, 64),
        # auto carries max_streams past its 16 processes a GPU: they take more streams each.
        ({"max_streams": 161}, 1, 161),
        ({"max_streams": 1024, "workers": {"streams_per_process": 1}}, 1, 1024),
        ({"max_streams": 400}, 2, 400),
        # A number of processes keeps streams_per_process as set.
        ({"max_streams": 161, "workers": {"processes": 16}}, 1, 128),
    ],
)
def test_what_a_server_can_run(values: dict[str, object], gpus: int, expected: int) -> None:
    """A fleet node offers the fleet this many streams unless cluster.capacity says."""
    plan = plan_workers(settings(**values), gpu_count=lambda: gpus)
    assert stream_capacity(settings(**values), plan) == expected


@pytest.mark.parametrize(
    ("values", "gpus", "expected"),
    [
        # CPU: auto keeps every stream in the API process; a number is a total.
        ({}, 0, ()),
        ({"workers": {"processes": 3}}, 0, (None, None, None)),
        # onnxruntime never plans GPU devices, even where GPUs exist.
        ({"backend": "onnxruntime", "workers": {"processes": 2}}, 4, (None, None)),
        # GPU, auto: each GPU's share of max_streams at streams_per_process each.
        ({"max_streams": 64}, 1, (0,) * 8),
        ({"max_streams": 64}, 2, (0, 0, 0, 0, 1, 1, 1, 1)),
        ({"max_streams": 16, "workers": {"streams_per_process": 16}}, 1, (0,)),
        ({"max_streams": 1024, "workers": {"streams_per_process": 1}}, 1, (0,) * 16),
        # GPU, a number: that many per GPU, on the configured devices only.
        ({"workers": {"processes": 2}, "gpu": {"devices": [1, 3]}}, 4, (1, 1, 3, 3)),
        ({"workers": {"processes": 0}}, 2, ()),
    ],
)
def test_plan(values: dict[str, object], gpus: int, expected: tuple[int | None, ...]) -> None:
    plan = plan_workers(settings(**values), gpu_count=lambda: gpus)
    assert plan.gpus == expected
    assert plan.processes == len(expected)


@pytest.mark.parametrize(
    ("values", "gpus", "expected"),
    [
        # One spare by default wherever worker processes run: per GPU, or in all on the CPU.
        ({"workers": {"processes": 3}}, 0, (None,)),
        ({"max_streams": 64}, 2, (0, 1)),
        ({"workers": {"processes": 2, "spares": 2}, "gpu": {"devices": [1, 3]}}, 4, (1, 1, 3, 3)),
        ({"workers": {"processes": 3, "spares": 3}}, 0, (None,) * 3),
        # None without worker processes, when disabled, or when dead workers stay dead.
        ({}, 0, ()),
        ({"workers": {"processes": 0}}, 2, ()),
        ({"workers": {"processes": 3, "spares": 0}}, 0, ()),
        ({"workers": {"processes": 3, "restart": False}}, 0, ()),
        ({"max_streams": 64, "workers": {"restart": False}}, 1, ()),
    ],
)
def test_spares(values: dict[str, object], gpus: int, expected: tuple[int | None, ...]) -> None:
    plan = plan_workers(settings(**values), gpu_count=lambda: gpus)
    assert plan.spare_gpus == expected


def test_spares_change_neither_auto_nor_the_cpu_threads() -> None:
    with_spares = settings(max_streams=64, workers={"spares": 4})
    without = settings(max_streams=64, workers={"spares": 0})
    for values in (with_spares, without):
        assert plan_workers(values, gpu_count=lambda: 1).gpus == (0,) * 8
    cpu = plan_workers(settings(workers={"processes": 2, "spares": 2}), gpu_count=lambda: 0)
    assert cpu.cpu_threads == max(1, (os.cpu_count() or 1) // 2)
    assert cpu.shared_gpus() == ()  # MPS is decided by the workers alone


def test_cpu_workers_share_the_cores() -> None:
    plan = plan_workers(settings(workers={"processes": 2}), gpu_count=lambda: 0)
    assert plan.cpu_threads == max(1, (os.cpu_count() or 1) // 2)
    assert plan_workers(settings(max_streams=8), gpu_count=lambda: 1).cpu_threads is None


def test_shared_gpus_are_where_mps_helps() -> None:
    plan = plan_workers(settings(workers={"processes": 2}), gpu_count=lambda: 2)
    assert plan.shared_gpus() == (0, 1)
    single = plan_workers(settings(workers={"processes": 1}), gpu_count=lambda: 2)
    assert single.shared_gpus() == ()


def test_devices_the_node_lacks_are_refused() -> None:
    with pytest.raises(ValueError, match=r"gpu.devices \[5\] do not exist; this node has 2"):
        plan_workers(settings(gpu={"devices": [0, 5]}), gpu_count=lambda: 2)


@pytest.mark.parametrize(
    ("gpu", "parent", "expected"),
    [(0, None, "0"), (3, "", "3"), (1, "2,3", "3"), (0, "GPU-aa, GPU-bb", "GPU-aa")],
)
def test_a_worker_sees_only_its_gpu(gpu: int, parent: str | None, expected: str) -> None:
    assert child_visible_devices(gpu, parent) == expected


@pytest.mark.parametrize("bad", [-1, 65, "all", 2.5])
def test_process_count_is_bounded(bad: object) -> None:
    with pytest.raises(ValueError, match=r"workers\.processes"):
        settings(workers={"processes": bad})


@pytest.mark.parametrize("bad", [-1, 9, "one", 1.5, None])
def test_spare_count_is_bounded(bad: object) -> None:
    with pytest.raises(ValueError, match=r"workers\.spares"):
        settings(workers={"spares": bad})


def test_worker_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VDET_WORKERS__PROCESSES", "8")
    monkeypatch.setenv("VDET_GPU__MPS", "off")
    monkeypatch.setenv("VDET_WORKERS__SPARES", "0")
    # The variable naming the file is accepted beside them.
    monkeypatch.setenv("VDET_CONFIG", "")
    loaded = load_settings()
    assert (loaded.workers.processes, loaded.gpu.mps, loaded.workers.spares) == (8, "off", 0)
    monkeypatch.setenv("VDET_WORKERS__PROCESES", "8")
    with pytest.raises(ConfigError, match=r"workers\.proceses: unknown key"):
        load_settings()


def test_mps_stays_off_where_it_cannot_help_or_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    assert mps.start_mps("on", ()) is None  # no GPU shared by two workers
    assert mps.start_mps("off", (0,)) is None


def test_mps_without_its_binary(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "none"))
    monkeypatch.setattr(mps.shutil, "which", lambda name: None)
    assert mps.start_mps("auto", (0,)) is None
    with pytest.raises(RuntimeError, match="nvidia-cuda-mps-control is not installed"):
        mps.start_mps("on", (0,))


def test_a_running_mps_daemon_is_used_as_it_is(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "control").touch()  # what a running daemon's pipe folder holds
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    daemon = mps.start_mps("auto", (0,))
    assert daemon is not None and not daemon.owned
    assert daemon.env == {"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)}
    daemon.stop()  # not ours: left running


def test_mps_daemon_started_and_stopped_through_its_control_binary(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A stand-in for nvidia-cuda-mps-control (the real one needs an NVIDIA driver): a script
    that records how it was called, so the start and quit commands and their environment
    are checked."""
    calls = tmp_path / "calls"
    control = tmp_path / "nvidia-cuda-mps-control"
    control.write_text(
        "#!/bin/sh\n"
        'echo "$* pipe=$CUDA_MPS_PIPE_DIRECTORY stdin=$(cat 2>/dev/null | tr -d "\\n")"'
        f" >> {calls}\n"
    )
    control.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path / "no-daemon"))
    daemon = mps.start_mps("on", (0,))
    assert daemon is not None and daemon.owned and daemon.folder is not None
    pipe = daemon.env["CUDA_MPS_PIPE_DIRECTORY"]
    assert pipe.startswith(str(daemon.folder))
    daemon.stop()
    lines = calls.read_text().splitlines()
    assert lines[0].startswith(f"-d pipe={pipe}")
    assert lines[1] == f" pipe={pipe} stdin=quit"
    assert not daemon.folder.exists()
