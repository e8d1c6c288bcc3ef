"""`vdet serve` with stream worker processes, for real: the installed entry point on the CPU
backend, three worker processes, real H.264 files and the real GStreamer RTSP server.

What is checked is what a user sees through the one API: streams spread over the workers,
one seq across processes with WebSocket resume, control errors with their statuses, metrics
merged into one /metrics, a worker killed with SIGKILL (its streams fail, then publish again
in the spare that takes its place, or in a new process when no spare is ready, while the others
go on and clients stay connected), and a clean stop with no orphan process.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from support.apptest import CLIP_WH, write_tiny_model
from support.procs import http_get
from support.rtsp import RtspServerFactory, free_port
from support.serve import Service, alive, start_service
from support.truth import SAMPLE
from support.videos import write_damaged_packets_copy, write_h264_clip
from support.waiting import wait_until
from support.webhooks import Receiver
from websockets.sync.client import connect

from vdet.ingest.urls import REFUSED_FILE

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("workers")


@pytest.fixture(scope="module")
def model(folder: Path) -> Path:
    return write_tiny_model(folder / "tiny.onnx")


@pytest.fixture(scope="module")
def clip(folder: Path) -> Path:
    return write_h264_clip(folder / "clip.mp4", seconds=2.0, fps=15, size_wh=CLIP_WH)


@pytest.fixture(scope="module")
def service(folder: Path, model: Path) -> Iterator[Service]:
    svc = start_service(
        folder, model, workers={"processes": 3, "streams_per_process": 2, "call_timeout_s": 20}
    )
    try:
        yield svc
    finally:
        svc.process.stop()


def stream(clip: Path, stream_id: str, **fields: Any) -> dict[str, Any]:
    return {"id": stream_id, "url": str(clip), "loop": True, "realtime": True, **fields}


def results(ws_url: str, count: int, timeout: float = 60) -> list[dict[str, Any]]:
    """The first `count` result messages of a WebSocket feed (other messages are kept too)."""
    out: list[dict[str, Any]] = []
    with connect(ws_url, open_timeout=10) as ws:
        deadline = time.monotonic() + timeout
        while len(out) < count:
            message = json.loads(ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            out.append(message)
    return out


def test_streams_spread_over_workers_with_one_seq_and_resume(
    service: Service, clip: Path, rtsp_server_factory: RtspServerFactory
) -> None:
    camera = rtsp_server_factory(clip, name="cam")
    for body in (stream(clip, "a"), stream(clip, "b"), {"id": "rtsp", "url": camera.url}):
        status, out = service.send("POST", "/v1/streams", body)
        assert status == 201, out
    status, listing = service.get("/v1/streams")
    assert status == 200
    placed = {s["id"]: s["worker"] for s in listing["streams"]}
    # Least loaded first: three streams on three workers; never on the spare.
    assert sorted(placed.values()) == ["w0", "w1", "w2"], placed
    assert {(w["name"], w["role"]): w["streams"] for w in service.workers()} == {
        ("w0", "worker"): 1,
        ("w1", "worker"): 1,
        ("w2", "worker"): 1,
        ("spare0", "spare"): 0,
    }

    wait_until(
        lambda: all(service.processed(s) > 0 for s in ("a", "b", "rtsp")),
        60,
        what="every stream publishing",
    )
    messages = results(f"{service.ws_base}/v1/events", 60)
    seqs = [m["result"]["seq"] for m in messages if m["type"] == "result"]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    sources = {m["result"]["source_id"] for m in messages if m["type"] == "result"}
    assert sources == {"a", "b", "rtsp"}, "every worker's results reach the one hub"
    for source in sources:
        frames = [
            m["result"]["frame_index"]
            for m in messages
            if m["type"] == "result" and m["result"]["source_id"] == source
        ]
        assert frames == sorted(frames), f"{source}: results in frame order"

    # Resume where the first connection stopped: the next seq, no duplicates.
    last = seqs[-1]
    again = results(f"{service.ws_base}/v1/events?after={last}", 5)
    assert again[0]["type"] == "result" and again[0]["result"]["seq"] == last + 1
    for body_id in ("a", "b", "rtsp"):
        assert service.send("DELETE", f"/v1/streams/{body_id}")[0] == 204
    assert service.get("/v1/streams")[1] == {"streams": []}


def test_control_calls_keep_their_statuses_across_processes(
    service: Service, clip: Path, folder: Path
) -> None:
    assert service.send("POST", "/v1/streams", stream(clip, "c"))[0] == 201
    try:
        status, out = service.send("POST", "/v1/streams", stream(clip, "c"))
        assert status == 409 and "already exists" in out["detail"]
        status, out = service.send("POST", "/v1/streams", stream(clip, "d", classes=["unicorn"]))
        assert status == 422 and "unicorn" in out["detail"]
        unicorns = stream(clip, "d", class_thresholds={"unicorn": 0.5})
        status, out = service.send("POST", "/v1/streams", unicorns)
        assert status == 422 and "unicorn" in out["detail"]
        status, out = service.send("PATCH", "/v1/streams/c", {"class_thresholds": {"car": 0.7}})
        assert status == 200 and out["effective"]["class_thresholds"] == {"car": 0.7}
        status, out = service.send("PATCH", "/v1/streams/c", {"class_thresholds": {"x": 0.7}})
        assert status == 422 and "'x'" in out["detail"]
        missing = str(folder / "missing.mp4")
        status, out = service.send("POST", "/v1/streams", {"id": "e", "url": missing})
        assert status == 422, out
        assert "e" not in {s["id"] for s in service.get("/v1/streams")[1]["streams"]}
        for method in ("GET", "PATCH", "DELETE"):
            body = {"conf_threshold": 0.5} if method == "PATCH" else None
            status, out = service.send(method, "/v1/streams/nope", body)
            assert status == 404, (method, out)
        status, out = service.send("PATCH", "/v1/streams/c", {"conf_threshold": 0.5})
        assert status == 200 and out["effective"]["conf_threshold"] == 0.5
        assert service.get("/v1/streams/c")[1]["effective"]["conf_threshold"] == 0.5
        # detect_fps reaches the worker's mailbox; its skipped count comes back in the status.
        status, out = service.send("PATCH", "/v1/streams/c", {"detect_fps": 5})
        assert status == 200 and out["spec"]["detect_fps"] == 5
        wait_until(
            lambda: service.get("/v1/streams/c")[1]["status"]["frames_skipped"] > 0,
            30,
            what="frames skipped in the worker process",
        )
        # Detections and the snapshot come from the owning worker, numbered by the hub.
        wait_until(lambda: service.get("/v1/streams/c/detections")[0] == 200, 30, what="result")
        status, jpeg = http_get(service.base + "/v1/streams/c/snapshot.jpg", timeout=10)
        assert status == 200 and jpeg[:2] == b"\xff\xd8"
    finally:
        service.send("DELETE", "/v1/streams/c")


def test_the_source_policy_holds_in_the_api_process(service: Service, tmp_path: Path) -> None:
    outside = tmp_path / "outside.mp4"  # not under the service's file roots
    outside.write_bytes(b"not a video")
    listed_before = {w["name"]: w["streams"] for w in service.workers()}
    for url in (str(outside), "/etc/hostname", "gopher://127.0.0.1/x"):
        status, out = service.send("POST", "/v1/streams", {"id": "p", "url": url})
        assert status == 422, (url, out)
    status, out = service.send("POST", "/v1/streams", {"id": "p", "url": str(outside)})
    assert out["detail"] == REFUSED_FILE  # the same answer, whether the file exists or not
    assert {w["name"]: w["streams"] for w in service.workers()} == listed_before


def test_credentials_never_come_back_from_a_worker(service: Service) -> None:
    secret = "s3cr3t-pass"
    url = f"rtsp://viewer:{secret}@127.0.0.1:{free_port()}/cam"  # nothing listens there
    status, out = service.send("POST", "/v1/streams", {"id": "cred", "url": url})
    assert status == 201, out
    try:
        assert out["worker"] is not None and secret not in json.dumps(out)
        # The worker's reader fails to connect: its error names the URL, redacted.
        wait_until(
            lambda: service.get("/v1/streams/cred")[1]["status"]["recent_errors"],
            30,
            what="a connection error",
        )
        for path in ("/v1/streams/cred", "/v1/streams"):
            status, body = service.get(path)
            assert status == 200 and secret not in json.dumps(body), body
        assert secret not in service.process.log_tail(2000)  # the workers log there too
    finally:
        service.send("DELETE", "/v1/streams/cred")


def test_damaged_video_in_a_worker_reaches_metrics(service: Service, folder: Path) -> None:
    damaged = folder / "damaged.mp4"
    write_damaged_packets_copy(SAMPLE, damaged)
    body = {"id": "dmg", "url": str(damaged), "loop": True, "realtime": False}
    assert service.send("POST", "/v1/streams", body)[0] == 201
    try:

        def counted() -> bool:
            metrics = service.metrics()
            label = (("source", "dmg"),)
            return metrics.get(("vdet_frames_damaged_total", label), 0.0) > 0 and (
                metrics.get(("vdet_decode_errors_total", label), 0.0) > 0
            )

        wait_until(counted, 60, interval=0.5, what="damaged frames counted in /metrics")
        status = service.get("/v1/streams/dmg")[1]["status"]
        assert status["frames_damaged"] > 0 and status["decode_errors"] > 0, status
    finally:
        service.send("DELETE", "/v1/streams/dmg")


def test_stream_limit_and_worker_capacity(service: Service, clip: Path) -> None:
    ids = [f"s{i}" for i in range(6)]  # max_streams 6 = 3 workers x 2 streams
    try:
        for stream_id in ids:
            assert service.send("POST", "/v1/streams", stream(clip, stream_id))[0] == 201
        status, out = service.send("POST", "/v1/streams", stream(clip, "one-too-many"))
        assert status == 409 and "limit" in out["detail"]
        assert sorted(w["streams"] for w in service.workers() if w["role"] == "worker") == [2] * 3
    finally:
        for stream_id in ids:
            service.send("DELETE", f"/v1/streams/{stream_id}")


def slot(service: Service, name: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [w for w in service.workers() if w["name"] == name]
    assert len(found) == 1, found
    return found[0]


def ready_spare(service: Service) -> dict[str, Any]:
    wait_until(lambda: slot(service, "spare0")["alive"], 120, what="the spare ready")
    spare = slot(service, "spare0")
    assert spare["role"] == "spare" and spare["streams"] == 0
    return spare


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def test_a_killed_worker_s_streams_move_to_the_ready_spare(service: Service, clip: Path) -> None:
    for stream_id in ("k1", "k2"):
        assert service.send("POST", "/v1/streams", stream(clip, stream_id))[0] == 201
    try:
        wait_until(
            lambda: service.processed("k1") > 0 and service.processed("k2") > 0,
            60,
            what="both streams publishing",
        )
        spare = ready_spare(service)
        spare_rss = rss_mib(spare["pid"])
        victim = service.get("/v1/streams/k1")[1]["worker"]
        assert victim != service.get("/v1/streams/k2")[1]["worker"]
        worker = slot(service, victim)
        with connect(
            f"{service.ws_base}/v1/streams/k2/events", open_timeout=10, max_queue=None
        ) as ws:
            os.kill(worker["pid"], signal.SIGKILL)
            killed_at = time.monotonic()
            # The spare's process (started before the kill) now serves under the dead
            # worker's name: no process had to start for k1 to run again.
            wait_until(
                lambda: slot(service, victim)["pid"] == spare["pid"],
                5.0,
                interval=0.02,
                what="the spare in the dead worker's place",
            )
            processed_before = service.processed("k1")
            wait_until(
                lambda: service.processed("k1") > processed_before + 2,
                60,
                interval=0.02,
                what="k1 publishing again",
            )
            restart_s = time.monotonic() - killed_at
            view = service.get("/v1/streams/k1")[1]
            assert view["worker"] == victim and view["status"]["state"] == "streaming", view
            assert slot(service, victim)["pid"] == spare["pid"], "k1 runs in the former spare"
            # The other worker's stream kept publishing to a client that stayed connected.
            during = [json.loads(ws.recv(timeout=20)) for _ in range(3)]
            assert all(m["type"] == "result" for m in during), during
            assert {m["result"]["source_id"] for m in during} == {"k2"}
        after = slot(service, victim)
        assert after["alive"] and after["role"] == "worker"
        # Its own log lines now name the slot it serves.
        wait_until(
            lambda: f"worker spare0 is now {victim}" in service.process.log_tail(5000),
            5,
            what="the former spare renamed",
        )
        assert after["restarts"] == worker["restarts"] + 1 and "SIGKILL" in after["last_exit"]
        # A new spare starts in the background, in a new process.
        replacement = ready_spare(service)
        assert replacement["pid"] not in (spare["pid"], worker["pid"])
        metrics = service.metrics()
        assert metrics[("vdet_worker_restarts_total", (("gpu", "cpu"), ("worker", victim)))] >= 1
        assert metrics[("vdet_worker_up", (("gpu", "cpu"), ("worker", victim)))] == 1.0
        assert metrics[("vdet_worker_up", (("gpu", "cpu"), ("worker", "spare0")))] == 1.0
        print(
            f"killed worker's stream published again {restart_s:.2f} s after SIGKILL "
            f"(restart_seconds={restart_s:.2f}, in the spare); an idle spare's RSS: "
            f"{spare_rss:.0f} MiB"
        )
    finally:
        for stream_id in ("k1", "k2"):
            service.send("DELETE", f"/v1/streams/{stream_id}")


def test_with_no_spare_ready_a_killed_worker_restarts_in_a_new_process(
    service: Service, clip: Path
) -> None:
    for stream_id in ("k1", "k2"):
        assert service.send("POST", "/v1/streams", stream(clip, stream_id))[0] == 201
    try:
        wait_until(
            lambda: service.processed("k1") > 0 and service.processed("k2") > 0,
            60,
            what="both streams publishing",
        )
        victim = service.get("/v1/streams/k1")[1]["worker"]
        survivor = service.get("/v1/streams/k2")[1]["worker"]
        assert victim != survivor
        worker = slot(service, victim)
        spare = ready_spare(service)
        with connect(
            f"{service.ws_base}/v1/streams/k2/events", open_timeout=10, max_queue=None
        ) as ws:
            # The spare dies first: its replacement cannot be ready when the worker dies.
            os.kill(spare["pid"], signal.SIGKILL)
            wait_until(lambda: not slot(service, "spare0")["alive"], 5, what="the spare gone")
            os.kill(worker["pid"], signal.SIGKILL)
            killed_at = time.monotonic()
            wait_until(
                lambda: service.get("/v1/streams/k1")[1]["status"]["state"] == "failed",
                2.0,
                interval=0.05,
                what="k1 failed within 2 s",
            )
            # How the worker ended is named once its process has been reaped.
            wait_until(
                lambda: (
                    "SIGKILL" in (service.get("/v1/streams/k1")[1]["status"]["last_error"] or "")
                ),
                5.0,
                interval=0.05,
                what="the reason named",
            )
            # The other worker's stream keeps publishing to a client that stays connected.
            during = [json.loads(ws.recv(timeout=20)) for _ in range(3)]
            assert all(m["type"] == "result" for m in during), during
            assert {m["result"]["source_id"] for m in during} == {"k2"}
            processed_before = service.processed("k1")
            wait_until(
                lambda: service.get("/v1/streams/k1")[1]["status"]["state"] == "streaming",
                90,
                what="k1 streaming again in a new worker",
            )
            wait_until(
                lambda: service.processed("k1") > processed_before, 60, what="k1 publishing again"
            )
            restart_s = time.monotonic() - killed_at
            after = [json.loads(ws.recv(timeout=20)) for _ in range(2)]
            assert all(m["type"] == "result" for m in after)
        now = slot(service, victim)
        assert now["alive"] and now["restarts"] == worker["restarts"] + 1
        assert now["pid"] not in (worker["pid"], spare["pid"]) and "SIGKILL" in now["last_exit"]
        spare_now = ready_spare(service)  # the killed spare was replaced too
        assert spare_now["restarts"] >= 1 and "SIGKILL" in spare_now["last_exit"]
        metrics = service.metrics()
        assert metrics[("vdet_worker_restarts_total", (("gpu", "cpu"), ("worker", victim)))] >= 1
        assert metrics[("vdet_worker_up", (("gpu", "cpu"), ("worker", victim)))] == 1.0
        print(f"without a spare: published again {restart_s:.2f} s after SIGKILL")
    finally:
        for stream_id in ("k1", "k2"):
            service.send("DELETE", f"/v1/streams/{stream_id}")


def test_metrics_are_one_registry_without_double_counting(service: Service, clip: Path) -> None:
    assert service.send("POST", "/v1/streams", stream(clip, "m"))[0] == 201
    try:
        wait_until(lambda: service.processed("m") >= 5, 60, what="five processed frames")
        seen = results(f"{service.ws_base}/v1/streams/m/events?after=0", 1)
        metrics = service.metrics()
        processed = metrics[("vdet_frames_processed_total", (("source", "m"),))]
        # Every result the hub numbered is counted once: no more than the hub has published.
        latest = service.get("/v1/streams/m/detections")[1]
        assert 0 < processed <= latest["seq"]
        assert seen[0]["result"]["source_id"] == "m"
        assert metrics[("vdet_streams", ())] == 1.0
        assert metrics[("vdet_source_state", (("source", "m"), ("state", "streaming")))] == 1.0
        assert metrics[("vdet_frames_decoded_total", (("source", "m"),))] >= processed
        for w in service.workers():
            up = metrics[("vdet_worker_up", (("gpu", "cpu"), ("worker", w["name"])))]
            assert up == 1.0 or w["role"] == "spare", w  # a spare may still be starting
    finally:
        service.send("DELETE", "/v1/streams/m")


def test_sigterm_stops_every_worker_and_leaves_no_orphan(
    folder: Path, model: Path, clip: Path
) -> None:
    svc = start_service(folder, model, workers={"processes": 2}, sources=[stream(clip, "t")])
    try:
        # Two workers and a spare, which may still be loading its model: stopped all the same.
        pids = [w["pid"] for w in svc.workers()]
        assert [w["role"] for w in svc.workers()] == ["worker", "worker", "spare"]
        assert all(alive(p) for p in pids)
        started = time.monotonic()
        svc.process.popen.send_signal(signal.SIGTERM)
        code = svc.process.popen.wait(timeout=10)
        assert time.monotonic() - started < 10
        # It stopped by itself, with the status of a clean stop (vdet.api.server).
        assert code == 0, svc.process.log_tail()
        assert "did not stop in time" not in svc.process.log_tail(200)
        wait_until(lambda: not any(alive(p) for p in pids), 2, what="workers gone")
    finally:
        svc.process.stop()


def test_streams_added_over_the_api_run_again_after_a_restart(
    folder: Path, model: Path, clip: Path, tmp_path: Path
) -> None:
    """`streams_file` through the real entry point with worker processes: what the API added
    and changed is back after a SIGTERM and a new `vdet serve`, and detects again."""
    kept = tmp_path / "streams.json"
    zone = {"kind": "line", "points": [[0.5, 0], [0.5, 1]]}
    svc = start_service(folder, model, workers={"processes": 2}, streams_file=str(kept))
    try:
        assert svc.send("POST", "/v1/streams", stream(clip, "kept"))[0] == 201
        assert svc.send("PATCH", "/v1/streams/kept", {"conf_threshold": 0.4})[0] == 200
        assert svc.send("PUT", "/v1/streams/kept/zones/middle", zone)[0] == 201
        status, before = svc.get("/v1/streams/kept")
        assert status == 200
        svc.process.popen.send_signal(signal.SIGTERM)
        assert svc.process.popen.wait(timeout=10) == 0, svc.process.log_tail()
    finally:
        svc.process.stop()

    svc = start_service(folder, model, workers={"processes": 2}, streams_file=str(kept))
    try:
        status, after = svc.get("/v1/streams/kept")
        assert status == 200
        assert after["spec"] == before["spec"]
        assert after["spec"]["conf_threshold"] == 0.4
        assert [z["id"] for z in after["spec"]["zones"]] == ["middle"]
        assert svc.get("/readyz")[1]["sources_restored"] == 1
        wait_until(lambda: svc.processed("kept") > 0, 30, what="the kept stream detecting")
    finally:
        svc.process.stop()


def test_zone_events_of_worker_processes_reach_a_webhook_with_their_snapshot(
    folder: Path, model: Path, clip: Path
) -> None:
    """Results cross from the workers already encoded; the API process's webhooks still find
    their events (the tiny model's fixed boxes become tracks inside a zone over the frame), and
    the snapshot the body names comes from the worker process that keeps it."""
    receiver = Receiver()
    zone = {"id": "all", "kind": "polygon", "points": [[0, 0], [1, 0], [1, 1], [0, 1]]}
    svc = start_service(
        folder,
        model,
        workers={"processes": 2},
        notify={"webhooks": [{"id": "ops", "url": receiver.url, "secret": "s3cret-s3cret"}]},
        sources=[stream(clip, "gate", zones=[zone])],
    )
    try:
        wait_until(lambda: receiver.requests, 30, what="a webhook delivery")
        headers, raw = receiver.requests[0]
        body = json.loads(raw)
        assert (body["webhook"], body["source_id"]) == ("ops", "gate")
        assert {e["type"] for e in body["events"]} == {"zone_enter"}
        assert body["seq"] >= 1 and "detections" not in body
        assert headers["x-vdet-signature"].startswith("t=")
        # The frame's event snapshot, kept in the worker process that runs the stream.
        status, jpeg = http_get(svc.base + body["snapshot"], timeout=10)
        assert status == 200, jpeg[:200]
        image = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
        assert image.shape == (CLIP_WH[1], CLIP_WH[0], 3)
        status, kept = svc.get("/v1/streams/gate/snapshots")
        assert status == 200 and kept["kept"] >= 1, kept
        assert body["snapshot"] in [snap["url"] for snap in kept["snapshots"]]
        snapshots_kept = ("vdet_event_snapshots_total", (("outcome", "kept"), ("source", "gate")))
        assert svc.metrics().get(snapshots_kept, 0) >= 1, "counted in the worker, shown here"
        delivered = (
            "vdet_webhook_deliveries_total",
            (("outcome", "delivered"), ("webhook", "ops")),
        )
        assert svc.metrics().get(delivered, 0) >= 1
    finally:
        svc.process.stop()
        receiver.close()


def test_a_killed_api_process_takes_its_workers_with_it(folder: Path, model: Path) -> None:
    svc = start_service(folder, model, workers={"processes": 2})
    try:
        pids = [w["pid"] for w in svc.workers()]
        assert len(pids) == 3, "two workers and a spare"
        svc.process.popen.kill()
        svc.process.popen.wait(timeout=10)
        wait_until(lambda: not any(alive(p) for p in pids), 5, what="orphaned workers gone")
    finally:
        svc.process.stop()


def test_an_uploaded_image_is_detected_by_a_worker(service: Service) -> None:
    image = np.zeros((CLIP_WH[1], CLIP_WH[0], 3), np.uint8)
    ok, png = cv2.imencode(".png", image)
    assert ok
    request = urllib.request.Request(
        service.base + "/v1/detect?conf=0.5",
        data=png.tobytes(),
        method="POST",
        headers={"content-type": "image/png"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        out = json.loads(response.read())
    # The tiny model's fixed head: the person (0.9) and the car (0.6) pass conf 0.5.
    assert [d["class_name"] for d in out["detections"]] == ["person", "car"]


def test_live_video_comes_from_the_worker_numbered_by_the_hub(service: Service, clip: Path) -> None:
    assert service.send("POST", "/v1/streams", stream(clip, "v"))[0] == 201
    try:
        wait_until(lambda: service.get("/v1/streams/v/detections")[0] == 200, 30, what="result")
        url = service.base + "/v1/streams/v/live.mjpeg?fps=5"
        with urllib.request.urlopen(url, timeout=30) as response:
            head = b""
            while b"\xff\xd9" not in head and len(head) < 1 << 20:
                head += response.read1(65536)
        seq = int(head.split(b"X-Vdet-Seq: ", 1)[1].split(b"\r\n", 1)[0])
        assert b"\xff\xd8" in head
        # The part's seq is the hub's seq of that frame's result, as the WebSocket feed has it.
        assert 0 < seq <= service.get("/v1/streams/v/detections")[1]["seq"]
    finally:
        service.send("DELETE", "/v1/streams/v")
