"""What the API process's `WorkerPool` checks itself, before any worker process is asked."""

from __future__ import annotations

from pathlib import Path

import pytest

from vdet.config.settings import Settings
from vdet.config.streams import StreamSpec
from vdet.ingest.urls import REFUSED_FILE
from vdet.metrics.registry import Metrics
from vdet.results.hub import ResultsHub
from vdet.root import open_worker_streams
from vdet.streams.manager import LimitError
from vdet.workers.plan import WorkerPlan
from vdet.workers.pool import WorkerPool


def test_a_source_the_policy_refuses_never_reaches_a_worker(tmp_path: Path) -> None:
    # No worker process runs: a spec that got past the API process's checks would be refused
    # for want of a worker (LimitError), so a ValueError here was raised in this process.
    plan = WorkerPlan(gpus=(None,), streams_per_process=2)
    pool = WorkerPool(Settings(), plan, ResultsHub(), Metrics(), open_worker_streams)
    outside = tmp_path / "clip.mp4"
    outside.write_bytes(b"x")
    for url in (str(outside), str(tmp_path / "missing.mp4")):
        with pytest.raises(ValueError, match=REFUSED_FILE):
            pool.add(StreamSpec(id="a", url=url))
    with pytest.raises(ValueError, match="scheme"):
        pool.add(StreamSpec(id="a", url="gopher://127.0.0.1/x"))
    with pytest.raises(LimitError):
        pool.add(StreamSpec(id="a", url="rtsp://127.0.0.1:8554/cam"))
    assert len(pool) == 0


@pytest.mark.parametrize(
    ("per_process", "named"),
    [
        (8, "(workers.streams_per_process)"),
        (10, "(max_streams over the GPU's worker processes, workers.processes auto)"),
    ],
)
def test_a_full_gpu_says_what_set_each_worker_s_share(per_process: int, named: str) -> None:
    # A worker's share is workers.streams_per_process (8 by default) unless `auto` raised it
    # to carry max_streams; the refusal names the one that applies. No worker process runs
    # here, so the GPU's only worker is never open.
    plan = WorkerPlan(gpus=(0,), streams_per_process=per_process)
    pool = WorkerPool(Settings(), plan, ResultsHub(), Metrics(), open_worker_streams)
    with pytest.raises(LimitError) as refused:
        pool.add(StreamSpec(id="a", url="rtsp://127.0.0.1:8554/cam"))
    assert f"of GPU 0 already has {per_process} stream(s) {named}" in str(refused.value)
