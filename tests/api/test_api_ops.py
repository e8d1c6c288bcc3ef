"""Health, readiness, configured sources at start-up, /metrics and the OpenAPI document."""

from __future__ import annotations

import gc
import logging
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.apptest import MakeSettings, TestClient, stream_body
from support.waiting import wait_until

from vdet.api.app import create_app
from vdet.api.server import QuietPolls

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(client: TestClient) -> Samples:
    r = client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    out: Samples = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def test_healthz(client: TestClient) -> None:
    r = client.get("/healthz")
    assert (r.status_code, r.json()) == (200, {"status": "ok"})


def test_ready_once_started_and_503_before(make_settings: MakeSettings, clip: Path) -> None:
    settings = make_settings(sources=[stream_body(clip, "configured")])
    app = create_app(settings)
    not_started = TestClient(app)  # no `with`: the lifespan has not run
    r = not_started.get("/readyz")
    assert r.status_code == 503
    assert r.json()["ready"] is False
    assert not_started.get("/healthz").status_code == 200
    assert not_started.get("/v1/streams").status_code == 503
    with TestClient(app) as client:
        r = client.get("/readyz")
        assert r.status_code == 200
        assert r.json() == {
            "ready": True,
            "detector_loaded": True,
            "sources_configured": 1,
            "sources_started": 1,
            "sources_restored": 0,
            "worker_processes": 0,
            "mps": False,
            "detail": None,
            "backend": "onnxruntime",
            "data_path": "cpu",
            "backend_selection": "configured: backend onnxruntime",
            "streams_decoded_on_cpu": {},
        }
        assert [s["id"] for s in client.get("/v1/streams").json()["streams"]] == ["configured"]
    # After shutdown the streams are gone and the service reports not ready.
    assert not_started.get("/readyz").status_code == 503


def test_startup_fails_clearly_for_a_bad_configured_source(
    make_settings: MakeSettings, clip: Path
) -> None:
    settings = make_settings(sources=[stream_body(clip, "cam", classes=["unicorn"])])
    with (
        pytest.raises(RuntimeError, match=r"configured source 'cam': unknown class.*unicorn"),
        TestClient(create_app(settings)),
    ):
        pass


def test_startup_fails_clearly_without_the_model(
    make_settings: MakeSettings, tmp_path: Path
) -> None:
    settings = make_settings(model_path=tmp_path / "missing.onnx")
    with (
        pytest.raises(FileNotFoundError, match=r"missing\.onnx"),
        TestClient(create_app(settings)),
    ):
        pass


def test_metrics_cover_the_pipeline_and_forget_deleted_streams(
    client: TestClient, clip: Path
) -> None:
    assert client.post("/v1/streams", json=stream_body(clip)).status_code == 201
    wait_until(
        lambda: (value(scrape(client), "vdet_frames_processed_total", source="cam") or 0) >= 3,
        10,
        what="three processed frames",
    )
    s = scrape(client)
    for stage in ("decode", "preprocess", "inference", "postprocess"):
        count = value(s, "vdet_stage_latency_seconds_count", source="cam", stage=stage)
        assert count is not None
        assert count >= 3
    assert (value(s, "vdet_end_to_end_latency_seconds_count", source="cam") or 0) >= 3
    assert (value(s, "vdet_frames_decoded_total", source="cam") or 0) >= 3
    assert value(s, "vdet_frames_dropped_total", source="cam") is not None
    assert value(s, "vdet_source_reconnects_total", source="cam") == 0.0
    assert value(s, "vdet_source_state", source="cam", state="streaming") == 1.0
    assert value(s, "vdet_source_state", source="cam", state="failed") == 0.0
    age = value(s, "vdet_source_last_frame_age_seconds", source="cam")
    assert age is not None
    assert 0 <= age < 5
    assert value(s, "vdet_streams") == 1.0
    assert value(s, "vdet_websocket_clients") == 0.0
    assert value(s, "vdet_inference_eager_fallbacks_total") == 0.0
    backend = [labels for (name, labels) in s if name == "vdet_backend_info"]
    assert len(backend) == 1
    info = dict(backend[0])
    assert info["backend"] == "onnxruntime"
    assert info["model"].startswith("tiny.onnx@")
    assert info["device"].startswith("cpu")
    assert info["precision"] == "fp32"
    assert info["data_path"] == "cpu"
    assert info["selection"] == "configured: backend onnxruntime"

    assert client.delete("/v1/streams/cam").status_code == 204
    s = scrape(client)
    assert not [key for key in s if ("source", "cam") in key[1]]
    assert value(s, "vdet_streams") == 0.0


def test_metrics_time_event_loop_lag_and_gc_pauses_while_serving(
    make_settings: MakeSettings,
) -> None:
    hooks_before = list(gc.callbacks)
    with TestClient(create_app(make_settings())) as client:
        assert len(gc.callbacks) == len(hooks_before) + 1
        gc.collect(2)  # timed whichever thread collects: the hook is the process's
        wait_until(
            lambda: (
                (value(scrape(client), "vdet_api_gc_pause_seconds_count", generation="2") or 0) >= 1
            ),
            10,
            what="a full collection timed",
        )
        wait_until(
            lambda: (value(scrape(client), "vdet_api_event_loop_lag_seconds_count") or 0) >= 3,
            10,
            what="three loop-lag probes",
        )
        lag = value(scrape(client), "vdet_api_event_loop_lag_seconds_sum")
        assert lag is not None and lag >= 0
    assert gc.callbacks == hooks_before  # the hook leaves with the app


def test_startup_objects_can_be_frozen_out_of_the_collectors_reach(
    make_settings: MakeSettings,
) -> None:
    assert gc.get_freeze_count() == 0
    try:
        with TestClient(create_app(make_settings(), freeze_startup_objects=True)) as client:
            assert client.get("/readyz").status_code == 200
            assert gc.get_freeze_count() > 10_000  # modules, routes, the model session
    finally:
        gc.unfreeze()  # other tests' objects must stay collectable


def test_openapi_documents_routes_status_codes_and_tags(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    paths = spec["paths"]

    def codes(path: str, method: str) -> set[str]:
        return set(paths[path][method]["responses"])

    assert codes("/v1/streams", "post") >= {"201", "409", "422", "503"}
    assert codes("/v1/streams", "get") >= {"200"}
    assert codes("/v1/streams/{stream_id}", "get") >= {"200", "404"}
    assert codes("/v1/streams/{stream_id}", "patch") >= {"200", "404", "422"}
    assert codes("/v1/streams/{stream_id}", "delete") >= {"204", "404"}
    assert codes("/v1/streams/{stream_id}/detections", "get") >= {"200", "204", "404"}
    assert codes("/v1/streams/{stream_id}/snapshot.jpg", "get") >= {"200", "204", "404"}
    assert codes("/v1/detect", "post") >= {"200", "413", "415", "422"}
    assert codes("/readyz", "get") >= {"200", "503"}

    body = paths["/v1/detect"]["post"]["requestBody"]["content"]
    assert {"multipart/form-data", "image/jpeg", "image/png"} <= set(body)
    snapshot = paths["/v1/streams/{stream_id}/snapshot.jpg"]["get"]["responses"]["200"]
    assert "image/jpeg" in snapshot["content"]
    metrics = paths["/metrics"]["get"]["responses"]["200"]["content"]
    assert any(media.startswith("text/plain") for media in metrics)

    tags = {tag for ops in paths.values() for op in ops.values() for tag in op.get("tags", [])}
    assert tags == {"streams", "detect", "ops"}
    # JSON responses are typed, not bare objects.
    for path, method, code in [
        ("/v1/streams", "post", "201"),
        ("/v1/streams", "get", "200"),
        ("/v1/streams/{stream_id}/detections", "get", "200"),
        ("/v1/detect", "post", "200"),
        ("/v1/streams", "post", "409"),
    ]:
        schema = paths[path][method]["responses"][code]["content"]["application/json"]["schema"]
        assert "$ref" in schema
    schemas = spec["components"]["schemas"]
    assert schemas["StreamSpec"]["additionalProperties"] is False
    assert all(p.get("description") for p in schemas["StreamSpec"]["properties"].values())


@pytest.mark.parametrize(
    ("method", "status", "at_info"),
    [
        ("GET", 200, False),
        ("HEAD", 304, False),
        ("GET", 404, True),
        ("POST", 201, True),
        ("DELETE", 204, True),
        ("GET", 503, True),
    ],
)
def test_access_lines_of_polls_are_debug_and_changes_and_errors_info(
    method: str, status: int, at_info: bool
) -> None:
    access = logging.getLogger("uvicorn.access")
    level = access.level
    access.setLevel(logging.INFO)
    record = access.makeRecord(
        access.name,
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5000", method, "/v1/streams", "1.1", status),
        None,
    )
    assert QuietPolls().filter(record) is at_info
    assert record.levelname == ("INFO" if at_info else "DEBUG")
    access.setLevel(logging.DEBUG)
    try:
        assert QuietPolls().filter(record) is True
    finally:
        access.setLevel(level)
