"""`vdet serve` on a GPU with stream worker processes, as users run it: the installed entry point,
the demo model on torch in each worker, NVDEC decode and CUDA graphs there, MPS when the node
has it, 1080p looping file streams added over REST and results read over WebSocket.

The CPU twin with three ONNX Runtime workers is tests/workers/test_workers_serve.py.
Needs a CUDA GPU, PyNvVideoCodec, PyAV, onnx2torch and cuda-python (skipped otherwise).
"""

from __future__ import annotations

import json
import os
import signal
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    pytest.importorskip("PyNvVideoCodec")
pytest.importorskip("av")
pytest.importorskip("onnx2torch")
pytest.importorskip("cuda.bindings")
pytest.importorskip("websockets")

from support.serve import Service, alive, start_service  # noqa: E402
from support.waiting import wait_until  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "service" / "assets" / "demo.onnx"
SAMPLE = ROOT / "service" / "assets" / "sample.mp4"
STREAMS = ("g0", "g1", "g2", "g3")


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    folder = tmp_path_factory.mktemp("gpu_workers")
    svc = start_service(
        folder,
        DEMO,
        ready_timeout=300,
        backend="torch",
        max_streams=8,
        workers={"processes": 2, "streams_per_process": 4},
    )
    try:
        yield svc
    finally:
        svc.process.stop()


def test_streams_run_on_the_gpu_in_two_worker_processes(service: Service) -> None:
    status, ready = service.get("/readyz")
    assert status == 200 and ready["worker_processes"] == 2, ready
    workers = service.workers()
    assert [w["gpu"] for w in workers] == ["0", "0"]
    for stream_id in STREAMS:
        body = {"id": stream_id, "url": str(SAMPLE), "loop": True, "realtime": True}
        status, out = service.send("POST", "/v1/streams", body)
        assert status == 201, out
    wait_until(lambda: all(service.processed(s) >= 30 for s in STREAMS), 120, what="30 frames each")
    listing = service.get("/v1/streams")[1]["streams"]
    assert sorted(s["worker"] for s in listing) == ["w0", "w0", "w1", "w1"]
    assert all(s["status"]["state"] == "streaming" for s in listing)
    metrics = service.metrics()
    used = metrics.get(("vdet_gpu_memory_used_bytes", (("gpu", "0"),)), 0.0)
    assert used > 0, "the workers' GPU memory is reported under the node's GPU label"
    with connect(f"{service.ws_base}/v1/events", open_timeout=10) as ws:
        messages = [json.loads(ws.recv(timeout=10)) for _ in range(60)]
    seqs = [m["result"]["seq"] for m in messages]
    assert seqs == sorted(seqs) and len(set(seqs)) == 60
    boxes = [len(m["result"]["detections"]) for m in messages]
    assert sum(boxes) > 0, "the demo model finds the clip's shapes"
    print(f"mps={ready['mps']} workers={workers}")


def test_a_killed_gpu_worker_comes_back_and_the_other_keeps_publishing(
    service: Service,
) -> None:
    views = {s["id"]: s for s in service.get("/v1/streams")[1]["streams"]}
    victim = views["g0"]["worker"]
    others = [s for s, v in views.items() if v["worker"] != victim]
    (worker,) = [w for w in service.workers() if w["name"] == victim]
    dropped_before = {s: views[s]["status"]["frames_dropped"] for s in others}
    os.kill(worker["pid"], signal.SIGKILL)
    killed_at = time.monotonic()
    wait_until(
        lambda: service.get("/v1/streams/g0")[1]["status"]["state"] == "failed",
        2.0,
        interval=0.05,
        what="failed within 2 s",
    )
    before = {s: service.processed(s) for s in others}
    time.sleep(2.0)
    assert all(service.processed(s) > before[s] for s in others), "survivors keep publishing"
    processed = service.processed("g0")
    wait_until(lambda: service.processed("g0") > processed, 120, what="g0 publishing again")
    back_s = time.monotonic() - killed_at
    after = {s["id"]: s for s in service.get("/v1/streams")[1]["streams"]}
    dropped = {s: after[s]["status"]["frames_dropped"] - dropped_before[s] for s in others}
    print(f"g0 published again {back_s:.1f} s after SIGKILL; survivors dropped {dropped}")


def test_sigterm_leaves_no_worker_behind(service: Service) -> None:
    pids = [w["pid"] for w in service.workers()]
    started = time.monotonic()
    service.process.popen.send_signal(signal.SIGTERM)
    code = service.process.popen.wait(timeout=15)
    assert code in (0, -signal.SIGTERM), service.process.log_tail()
    print(f"stopped in {time.monotonic() - started:.1f} s")
    wait_until(lambda: not any(alive(p) for p in pids), 5, what="workers gone")
