"""Stream routes end to end: a real H.264 file through ingest, the ONNX detector and the hub."""

from __future__ import annotations

import itertools
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from support.apptest import CLIP_WH, MakeSettings, TestClient, expected_box, stream_body
from support.rtsp import free_port
from support.waiting import wait_until

from vdet.api.app import create_app


def latest(client: TestClient, stream_id: str = "cam") -> dict[str, Any] | None:
    r = client.get(f"/v1/streams/{stream_id}/detections")
    if r.status_code == 204:
        return None
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def wait_for_result(client: TestClient, stream_id: str = "cam", after: int = 0) -> dict[str, Any]:
    def newer() -> dict[str, Any]:
        body = latest(client, stream_id)
        return body if body is not None and body["seq"] > after else {}

    return wait_until(newer, 10, what=f"a result of {stream_id} after seq {after}")


def dead_camera_url() -> str:
    """An RTSP URL on a closed loopback port: the stream exists but never yields a frame."""
    return f"rtsp://127.0.0.1:{free_port()}/cam"


def test_add_stream_then_read_detections_in_source_pixels(client: TestClient, clip: Path) -> None:
    r = client.post("/v1/streams", json=stream_body(clip))
    assert r.status_code == 201, r.text
    assert r.headers["location"] == "/v1/streams/cam"
    body = r.json()
    assert body["id"] == "cam"
    assert body["spec"]["url"] == str(clip)
    assert body["effective"] == {
        "conf_threshold": 0.25,
        "iou_threshold": 0.45,
        "max_det": 300,
        "top_k": 1000,
        "classes": None,
        "class_thresholds": None,
    }

    result = wait_for_result(client)
    assert result["source_id"] == "cam"
    assert (result["image_width"], result["image_height"]) == CLIP_WH
    assert result["frame_index"] >= 0
    assert result["published_time"] >= result["arrival_time"]
    dets = result["detections"]
    assert [(d["class_id"], d["class_name"]) for d in dets] == [
        (0, "person"),
        (1, "car"),
        (2, "dog"),
    ]
    assert [round(d["score"], 3) for d in dets] == [0.9, 0.6, 0.3]
    for det, anchor in zip(dets, range(3), strict=True):
        assert det["box"] == pytest.approx(expected_box(anchor), abs=1e-3)
    assert set(result["timings_ms"]) == {
        "decode",
        "preprocess",
        "inference",
        "postprocess",
        "end_to_end",
    }
    assert result["timings_ms"]["end_to_end"] > 0

    status = client.get("/v1/streams/cam").json()["status"]
    assert status["state"] == "streaming"
    assert status["attempts"] == 1
    assert status["frames_decoded"] >= 1
    assert status["frames_processed"] >= 1
    assert status["last_frame_age_s"] is not None
    assert status["fps_nominal"] == pytest.approx(30.0)
    assert status["fps"] is not None
    assert (status["width"], status["height"]) == CLIP_WH


def test_list_get_and_delete(client: TestClient, clip: Path) -> None:
    assert client.get("/v1/streams").json() == {"streams": []}
    for stream_id in ("b-cam", "a.cam"):
        assert client.post("/v1/streams", json=stream_body(clip, stream_id)).status_code == 201
    listed = client.get("/v1/streams").json()["streams"]
    assert [s["id"] for s in listed] == ["a.cam", "b-cam"]
    assert client.get("/v1/streams/a.cam").json()["id"] == "a.cam"

    r = client.delete("/v1/streams/a.cam")
    assert r.status_code == 204
    assert r.content == b""
    assert client.get("/v1/streams/a.cam").status_code == 404
    assert client.get("/v1/streams/a.cam/detections").status_code == 404
    assert [s["id"] for s in client.get("/v1/streams").json()["streams"]] == ["b-cam"]


def test_patch_changes_thresholds_and_classes_from_the_next_frame(
    client: TestClient, clip: Path
) -> None:
    assert client.post("/v1/streams", json=stream_body(clip)).status_code == 201
    first = wait_for_result(client)
    assert len(first["detections"]) == 3

    r = client.patch("/v1/streams/cam", json={"conf_threshold": 0.5})
    assert r.status_code == 200, r.text
    assert r.json()["spec"]["conf_threshold"] == 0.5
    assert r.json()["effective"]["conf_threshold"] == 0.5
    # Results published before the change may still be in flight: wait for a new frame.
    seq = client.get("/v1/streams/cam/detections").json()["seq"]
    after = wait_for_result(client, after=seq + 1)
    assert [d["class_name"] for d in after["detections"]] == ["person", "car"]

    r = client.patch("/v1/streams/cam", json={"classes": ["car", 2], "conf_threshold": None})
    assert r.status_code == 200, r.text
    assert r.json()["effective"]["classes"] == ["car", "dog"]
    assert r.json()["effective"]["conf_threshold"] == 0.25  # null: back to the default
    seq = client.get("/v1/streams/cam/detections").json()["seq"]
    filtered = wait_for_result(client, after=seq + 1)
    assert [d["class_name"] for d in filtered["detections"]] == ["car", "dog"]

    r = client.patch("/v1/streams/cam", json={"max_det": 1, "classes": None})
    assert r.json()["effective"] == {
        "conf_threshold": 0.25,
        "iou_threshold": 0.45,
        "max_det": 1,
        "top_k": 1000,
        "classes": None,
        "class_thresholds": None,
    }


def test_class_thresholds_drop_each_class_under_its_own_and_patch_replaces_them(
    client: TestClient, clip: Path
) -> None:
    """The clip's person scores 0.9, car 0.6, dog 0.3; the stream's conf_threshold is 0.25."""
    body = stream_body(clip, class_thresholds={"car": 0.7})
    r = client.post("/v1/streams", json=body)
    assert r.status_code == 201, r.text
    assert r.json()["effective"]["class_thresholds"] == {"car": 0.7}
    result = wait_for_result(client)
    assert [d["class_name"] for d in result["detections"]] == ["person", "dog"]

    r = client.patch("/v1/streams/cam", json={"class_thresholds": {"2": 0.5, "person": 0.1}})
    assert r.status_code == 200, r.text
    assert r.json()["effective"]["class_thresholds"] == {"dog": 0.5, "person": 0.1}
    seq = client.get("/v1/streams/cam/detections").json()["seq"]
    after = wait_for_result(client, after=seq + 1)
    assert [d["class_name"] for d in after["detections"]] == ["person", "car"]

    r = client.patch("/v1/streams/cam", json={"class_thresholds": {"unicorn": 0.5}})
    assert r.status_code == 422 and "unicorn" in r.text
    assert client.get("/v1/streams/cam").json()["spec"]["class_thresholds"] == {
        "2": 0.5,
        "person": 0.1,
    }
    for bad in ({"car": 1.5}, {}, {"": 0.5}):
        r = client.patch("/v1/streams/cam", json={"class_thresholds": bad})
        assert r.status_code == 422, bad
    r = client.patch("/v1/streams/cam", json={"class_thresholds": None})
    assert r.json()["effective"]["class_thresholds"] is None
    seq = client.get("/v1/streams/cam/detections").json()["seq"]
    after = wait_for_result(client, after=seq + 1)
    assert [d["class_name"] for d in after["detections"]] == ["person", "car", "dog"]


def test_stream_classes_and_thresholds_at_creation(client: TestClient, clip: Path) -> None:
    body = stream_body(clip, classes=["dog"], conf_threshold=0.1, iou_threshold=0.7, max_det=5)
    r = client.post("/v1/streams", json=body)
    assert r.status_code == 201, r.text
    assert r.json()["effective"]["classes"] == ["dog"]
    result = wait_for_result(client)
    assert [d["class_name"] for d in result["detections"]] == ["dog"]


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"id": "cam", "url": "ftp://host/file.mp4"}, "rtsp://"),
        ({"id": "cam", "url": "concat:/a.mp4|/b.mp4"}, "unsupported source scheme"),
        ({"id": "cam", "url": "/no/such/file.mp4"}, "not allowed or cannot be opened"),
        ({"id": "cam", "url": "rtsp://h/s", "classes": ["unicorn"]}, "unicorn"),
        ({"id": "cam", "url": "rtsp://h/s", "classes": [7]}, "unknown class"),
    ],
)
def test_add_rejects_bad_sources_and_classes_with_422(
    client: TestClient, body: dict[str, Any], fragment: str
) -> None:
    r = client.post("/v1/streams", json=body)
    assert r.status_code == 422, r.text
    assert fragment in r.json()["detail"]
    assert client.get("/v1/streams").json() == {"streams": []}


def test_unsupported_scheme_names_the_allowed_ones(client: TestClient) -> None:
    detail = client.post("/v1/streams", json={"id": "x", "url": "udp://1.2.3.4:5"}).json()
    for scheme in ("rtsp://", "rtsps://", "http://", "https://", "file://"):
        assert scheme in detail["detail"]


@pytest.mark.parametrize(
    "body",
    [
        {"id": "bad id", "url": "rtsp://h/s"},
        {"id": "x" * 65, "url": "rtsp://h/s"},
        {"url": "rtsp://h/s"},
        {"id": "cam", "url": "rtsp://h/s", "unknown": 1},
        {"id": "cam", "url": "rtsp://h/s", "conf_threshold": 2},
        {"id": "cam", "url": "rtsp://h/s", "max_det": 0},
        {"id": "cam", "url": "rtsp://h/s", "loop": "sometimes"},
        [],
    ],
)
def test_add_rejects_invalid_bodies_with_422(client: TestClient, body: Any) -> None:
    r = client.post("/v1/streams", json=body)
    assert r.status_code == 422
    assert isinstance(r.json()["detail"], list)


def test_malformed_json_is_422(client: TestClient) -> None:
    r = client.post(
        "/v1/streams", content=b'{"id": "cam", "url":', headers={"content-type": "application/json"}
    )
    assert r.status_code == 422
    assert "detail" in r.json()


def test_duplicate_id_is_409_and_keeps_the_original(client: TestClient, clip: Path) -> None:
    assert client.post("/v1/streams", json=stream_body(clip)).status_code == 201
    r = client.post("/v1/streams", json={"id": "cam", "url": dead_camera_url()})
    assert r.status_code == 409
    assert "already exists" in r.json()["detail"]
    assert client.get("/v1/streams/cam").json()["spec"]["url"] == str(clip)


def test_stream_limit_is_409(make_settings: MakeSettings, clip: Path) -> None:
    with TestClient(create_app(make_settings(max_streams=2))) as client:
        for stream_id in ("a", "b"):
            assert client.post("/v1/streams", json=stream_body(clip, stream_id)).status_code == 201
        r = client.post("/v1/streams", json=stream_body(clip, "c"))
        assert r.status_code == 409
        assert "stream limit reached (2)" in r.json()["detail"]
        # Deleting one frees a slot.
        assert client.delete("/v1/streams/a").status_code == 204
        assert client.post("/v1/streams", json=stream_body(clip, "c")).status_code == 201


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/v1/streams/nope", None),
        ("PATCH", "/v1/streams/nope", {"conf_threshold": 0.5}),
        ("DELETE", "/v1/streams/nope", None),
        ("GET", "/v1/streams/nope/detections", None),
        ("GET", "/v1/streams/nope/snapshot.jpg", None),
    ],
)
def test_unknown_stream_is_404(client: TestClient, method: str, path: str, body: Any) -> None:
    r = client.request(method, path, json=body)
    assert r.status_code == 404
    assert r.json() == {"detail": "no stream 'nope'"}


@pytest.mark.parametrize(
    "patch",
    [
        {"conf_threshold": 1.5},
        {"iou_threshold": -1},
        {"max_det": 0},
        {"classes": []},
        {"detect_fps": 0},
        {"detect_fps": -5},
        {"detect_fps": "fast"},
        {"url": "rtsp://other/stream"},
        {"loop": True},
    ],
)
def test_patch_rejects_invalid_changes_with_422(client: TestClient, patch: dict[str, Any]) -> None:
    assert client.post("/v1/streams", json={"id": "cam", "url": dead_camera_url()}).status_code == (
        201
    )
    r = client.patch("/v1/streams/cam", json=patch)
    assert r.status_code == 422


def test_patch_rejects_unknown_classes_and_keeps_the_old_ones(client: TestClient) -> None:
    body = {"id": "cam", "url": dead_camera_url(), "classes": ["person"]}
    assert client.post("/v1/streams", json=body).status_code == 201
    r = client.patch("/v1/streams/cam", json={"classes": ["person", "unicorn"]})
    assert r.status_code == 422
    assert "unicorn" in r.json()["detail"]
    assert client.get("/v1/streams/cam").json()["effective"]["classes"] == ["person"]


def test_no_result_yet_is_204_for_detections_and_snapshot(client: TestClient) -> None:
    body = {"id": "cam", "url": dead_camera_url()}
    assert client.post("/v1/streams", json=body).status_code == 201
    r = client.get("/v1/streams/cam/detections")
    assert r.status_code == 204
    assert r.content == b""
    assert client.get("/v1/streams/cam/snapshot.jpg").status_code == 204
    # The failing camera shows in its status, the service keeps running.
    status = wait_until(
        lambda: (s := client.get("/v1/streams/cam").json()["status"])["last_error"] and s,
        10,
        what="a connection error",
    )
    assert status["state"] in {"failed", "backoff", "connecting"}
    assert status["frames_decoded"] == 0


def test_snapshot_is_the_last_frame_with_boxes(client: TestClient, clip: Path) -> None:
    assert client.post("/v1/streams", json=stream_body(clip)).status_code == 201
    wait_for_result(client)
    r = client.get("/v1/streams/cam/snapshot.jpg")
    assert r.status_code == 200
    assert r.headers["content-type"] == "image/jpeg"
    assert int(r.headers["x-vdet-seq"]) >= 1
    image = cv2.imdecode(np.frombuffer(r.content, np.uint8), cv2.IMREAD_COLOR)
    assert image is not None
    assert image.shape == (CLIP_WH[1], CLIP_WH[0], 3)
    # The person box is drawn along its edge (x1 = 48): a coloured, non-background line.
    x1, y1, _, y2 = (round(v) for v in expected_box(0))
    edge = image[y1 + 4 : y2 - 4, x1].astype(int)
    assert edge.std(axis=1).mean() > 40  # saturated box colour, not the grey-ish gradient


def test_file_that_ends_stops_its_stream_but_keeps_it_listed(
    client: TestClient, clip: Path
) -> None:
    body = stream_body(clip, loop=False, realtime=False)
    assert client.post("/v1/streams", json=body).status_code == 201
    status = wait_until(
        lambda: (s := client.get("/v1/streams/cam").json()["status"])["state"] == "stopped" and s,
        10,
        what="the file to end",
    )
    assert status["frames_decoded"] == 30
    assert latest(client) is not None


def test_file_sources_can_be_disabled_for_api_clients(
    make_settings: MakeSettings, clip: Path
) -> None:
    settings = make_settings(allow_file_sources=False, sources=[stream_body(clip, "configured")])
    with TestClient(create_app(settings)) as client:
        # Declared in the configuration: allowed. From an API client: refused, by path or URL.
        assert client.get("/v1/streams/configured").status_code == 200
        for url in (str(clip), f"file://{clip}"):
            r = client.post("/v1/streams", json={"id": "cam", "url": url})
            assert r.status_code == 422
            assert "allow_file_sources" in r.json()["detail"]
        r = client.post("/v1/streams", json={"id": "cam", "url": dead_camera_url()})
        assert r.status_code == 201


def test_delete_and_re_add_under_concurrency_leaves_a_consistent_stream(
    client: TestClient, clip: Path
) -> None:
    """DELETE racing POST of the same id: the survivor keeps its results and metrics."""
    for _ in range(3):
        assert client.post("/v1/streams", json=stream_body(clip)).status_code == 201
        with ThreadPoolExecutor(2) as pool:
            deleted = pool.submit(client.delete, "/v1/streams/cam")
            added = pool.submit(client.post, "/v1/streams", json=stream_body(clip))
            codes = (deleted.result().status_code, added.result().status_code)
        assert codes in {(204, 201), (204, 409)}
        if codes[1] == 201:
            wait_for_result(client)
            metrics = client.get("/metrics").text
            assert 'vdet_frames_processed_total{source="cam"}' in metrics
        client.delete("/v1/streams/cam")
        assert client.get("/v1/streams").json() == {"streams": []}


def _pts_steps(ws: Any, n: int) -> list[float]:
    """The steps between the presentation times of the next `n` results (within each pass of
    the looping clip: it starts over at 0)."""
    pts: list[float] = []
    while len(pts) < n:
        message = ws.receive_json()
        assert message["type"] == "result", message
        pts.append(message["result"]["pts_s"])
    return [round(b - a, 4) for a, b in itertools.pairwise(pts) if b > a]


def test_detect_fps_detects_evenly_spaced_frames_and_counts_the_rest_as_skipped(
    client: TestClient, clip: Path
) -> None:
    # The clip is 30 fps; analysed unpaced (every frame decoded, as fast as detection goes)
    # at detect_fps 10, every third frame is detected: by the frames' timestamps, not the clock.
    r = client.post("/v1/streams", json=stream_body(clip, detect_fps=10, realtime=False))
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["detect_fps"] == 10
    with client.websocket_connect("/v1/streams/cam/events?after=0") as ws:
        steps = _pts_steps(ws, 25)
    assert steps and all(step == pytest.approx(0.1, abs=0.002) for step in steps), steps
    status = client.get("/v1/streams/cam").json()["status"]
    assert status["frames_skipped"] >= 2 * (status["frames_processed"] - 2)
    assert status["frames_dropped"] == 0
    skipped = [
        line
        for line in client.get("/metrics").text.splitlines()
        if line.startswith('vdet_frames_skipped_total{source="cam"}')
    ]
    assert len(skipped) == 1 and float(skipped[0].split()[-1]) > 0

    # Changed on the running stream; null goes back to every frame.
    r = client.patch("/v1/streams/cam", json={"detect_fps": None})
    assert r.status_code == 200, r.text
    assert r.json()["spec"]["detect_fps"] is None
    with client.websocket_connect("/v1/streams/cam/events") as ws:
        steps = _pts_steps(ws, 40)
    assert any(step == pytest.approx(1 / 30, abs=0.002) for step in steps), steps
