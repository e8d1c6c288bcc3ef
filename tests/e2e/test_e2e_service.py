"""The whole service on the CPU: a real RTSP camera, the demo model, REST and WebSocket.

A GStreamer RTSP server plays the committed sample clip (1080p30 H.264) in real time; the
stream is added over REST like a user would, and its detections are scored against the clip's
exact ground truth. Then the camera dies and comes back while a second stream keeps running.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from support import truth
from support.apptest import TestClient
from support.rtsp import RtspServer, RtspServerFactory
from support.waiting import wait_until

from vdet.api.app import create_app
from vdet.config.settings import Settings
from vdet.core.assets import asset_path

pytestmark = pytest.mark.slow


@pytest.fixture
def client() -> Iterator[TestClient]:
    settings = Settings(
        model_path=asset_path("demo.onnx"),
        backend="onnxruntime",
        ingest={
            "connect_timeout_s": 2.0,
            "read_timeout_s": 2.0,
            "stall_timeout_s": 2.0,
            "backoff_initial_s": 0.1,
            "backoff_max_s": 0.5,
        },
    )
    with TestClient(create_app(settings)) as c:
        yield c


@pytest.fixture
def camera(rtsp_server_factory: RtspServerFactory) -> RtspServer:
    return rtsp_server_factory(truth.SAMPLE, name="sample")


def _state(client: TestClient, stream_id: str) -> str:
    return str(client.get(f"/v1/streams/{stream_id}").json()["status"]["state"])


def _results(client: TestClient, stream_id: str, count: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    with client.websocket_connect(f"/v1/streams/{stream_id}/events?after=0") as ws:
        while len(out) < count:
            message = ws.receive_json()
            if message.get("type", "result") == "result":
                out.append(message.get("result", message))
    return out


def test_rtsp_stream_detects_the_labelled_objects(client: TestClient, camera: RtspServer) -> None:
    response = client.post("/v1/streams", json={"id": "cam", "url": camera.url})
    assert response.status_code == 201, response.text
    results = _results(client, "cam", 12)
    assert all(r["image_width"] == 1920 and r["image_height"] == 1080 for r in results)
    # The camera started its loop before we connected: align the first result to the truth by
    # content, then follow the decoder's frame indexes from there.
    first = results[0]
    offset = truth.best_aligned_frame(first["detections"]) - first["frame_index"]
    pairs = [(r["frame_index"] + offset, r["detections"]) for r in results]
    assert truth.recall(pairs) >= 0.9


def test_camera_dies_and_recovers_while_other_streams_run(
    client: TestClient, camera: RtspServer
) -> None:
    file_stream = {"id": "file", "url": str(truth.SAMPLE), "loop": True, "realtime": True}
    assert client.post("/v1/streams", json=file_stream).status_code == 201
    assert client.post("/v1/streams", json={"id": "cam", "url": camera.url}).status_code == 201
    wait_until(lambda: _state(client, "cam") == "streaming", 20, what="camera streaming")

    camera.kill()
    wait_until(
        lambda: _state(client, "cam") in {"stalled", "failed", "backoff", "connecting"},
        15,
        what="camera loss noticed",
    )
    before = client.get("/v1/streams/file/detections").json()["seq"]
    time.sleep(1.0)
    during = client.get("/v1/streams/file/detections").json()["seq"]
    assert during > before, "the file stream must keep publishing while the camera is down"
    status = client.get("/v1/streams/cam").json()["status"]
    assert status["last_error"]

    camera.start()
    wait_until(lambda: _state(client, "cam") == "streaming", 30, what="camera recovered")
    status = client.get("/v1/streams/cam").json()["status"]
    assert status["reconnects"] >= 1 and status["attempts"] >= 2
    assert _state(client, "file") == "streaming"
    metrics = client.get("/metrics").text
    assert 'vdet_source_reconnects_total{source="cam"}' in metrics
