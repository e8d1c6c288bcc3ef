"""bench/gpu/streams.py's host-side logic, which runs before and around any GPU work: the run
list it parses, the MPS daemon it starts for a run, and the GPU-busy window it averages."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from support.lab import load_script


@pytest.fixture(scope="module")
def streams() -> ModuleType:
    return load_script("gpu/streams.py")


def test_run_list_options(streams: ModuleType) -> None:
    plan = streams._listed_runs("vdet:64:p:b8:x8:mps decode_only:64:u:x16:8 vdet:1:p:-:spin", 8.0)
    assert plan[0] == {
        "system": "vdet",
        "sources": 64,
        "paced": True,
        "batch": 8,
        "seconds": 8.0,
        "processes": 8,
        "mps": True,
    }
    assert plan[1]["batch"] is None and plan[1]["processes"] == 16  # decode-only has no batch
    assert plan[2]["host_wait"] == "spin" and "mps" not in plan[2]
    assert [streams._name(p) for p in plan] == [
        "vdet paced 64 b8 x8proc mps",
        "decode_only unpaced 64 x16proc",
        "vdet paced 1 b1 spin",
    ]
    passes = streams._listed_runs("decode_only:64:p:x8:passsess", 8.0)[0]
    assert passes["session_per_pass"] is True
    assert streams._name(passes) == "decode_only paced 64 x8proc session-per-pass"
    with pytest.raises(SystemExit, match="bad option"):
        streams._listed_runs("vdet:64:p:mpx", 8.0)
    with pytest.raises(SystemExit, match="bad run"):
        streams._listed_runs("vdet:64:q", 8.0)


def test_mps_daemon_needs_its_control_binary(
    streams: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(streams.shutil, "which", lambda name: None)
    with (
        pytest.raises(RuntimeError, match="nvidia-cuda-mps-control not found"),
        streams._mps_daemon(),
    ):
        pass


def test_mps_clients_are_counted_from_the_control_log(streams: ModuleType, tmp_path: Path) -> None:
    assert streams._mps_clients(tmp_path) == 0  # no log: no client
    (tmp_path / "control.log").write_text(
        "[2026-12-02 22:12:20.1] Start\n"
        "[2026-12-02 22:12:21.2] NEW CLIENT 4242 from user 0: Server is not ready, push client\n"
        "[2026-12-02 22:12:21.3] Starting new server 4243 for user 0\n"
        "[2026-12-02 22:12:22.4] NEW CLIENT 4244 from user 0: Server already exists\n"
    )
    assert streams._mps_clients(tmp_path) == 2


def test_gpu_busy_is_averaged_over_the_run_window(streams: ModuleType) -> None:
    sampler = streams._GpuSampler.__new__(streams._GpuSampler)  # no NVML, no thread
    sampler._samples = [(99.0, 100, 100), (100.0, 90, 30), (105.0, 80, 40), (111.0, 0, 0)]
    assert sampler.window(100.0, 10.0) == {
        "sm_busy_pct_mean": 85.0,
        "nvdec_busy_pct_mean": 35.0,
        "samples": 2,
    }
    assert sampler.window(None, 10.0) is None  # a run that failed has no window
    assert sampler.window(200.0, 10.0) is None


def test_input_shape_runs_are_each_held_to_the_decode_only_ceiling(streams: ModuleType) -> None:
    plan = streams._listed_runs(
        "decode_only:64:u:x8 vdet:64:u:1:x8:mps:rect vdet:64:u:1:x8:mps:square", 8.0
    )
    assert [p.get("input_shape") for p in plan] == [None, "rect", "square"]
    assert [streams._name(p) for p in plan[1:]] == [
        "vdet unpaced 64 b1 x8proc mps rect",
        "vdet unpaced 64 b1 x8proc mps square",
    ]
    runs = [
        {"name": "decode_only unpaced 64 x8proc", "system": "decode_only", "paced": False,
         "sources": 64, "fps_aggregate": 2000.0},
        {"name": "rect", "system": "vdet", "paced": False, "sources": 64,
         "fps_aggregate": 1900.0, "input_shape": "rect"},
        {"name": "square", "system": "vdet", "paced": False, "sources": 64,
         "fps_aggregate": 1500.0, "input_shape": "square"},
    ]  # fmt: skip
    report = {"runs": runs}
    streams._summarise(report)
    shaped = {t["what"]: t for t in report["targets"] if "decode-only ceiling" in t["what"]}
    assert shaped["rect: >= 90% of the decode-only ceiling"]["met"] is True
    assert shaped["square: >= 90% of the decode-only ceiling"]["met"] is False
    assert report["ceiling"]["vdet_run"] == "rect"
