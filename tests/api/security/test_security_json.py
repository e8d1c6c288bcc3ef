"""JSON that strict JSON cannot say back: non-finite numbers, lone surrogates and values of the
wrong kind, at every field of every request body. Each is answered 422 with a short, renderable
excerpt; nothing is stored and nothing answers 5xx."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.apptest import MakeSettings, TestClient

from vdet.api.app import create_app
from vdet.config.streams import StreamSpec
from vdet.config.tracking import TrackingSpec, ZoneBody
from vdet.streams.service import StreamChanges

URL = "rtsp://10.0.0.7/s"
LINE: dict[str, Any] = {"kind": "line", "points": [[0.1, 0.5], [0.9, 0.5]]}
SQUARE: dict[str, Any] = {"kind": "polygon", "points": [[0.1, 0.1], [0.9, 0.1], [0.9, 0.9]]}


@pytest.fixture(scope="module")
def app_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """One app for the module (hypothesis runs many examples against it), with stream `cam`."""
    from support.apptest import write_tiny_model

    from vdet.config.settings import Settings

    model = write_tiny_model(tmp_path_factory.mktemp("json_model") / "tiny.onnx")
    app = create_app(
        Settings(model_path=model, backend="onnxruntime", ingest={"connect_timeout_s": 0.5})
    )
    with TestClient(app) as c:
        assert c.post("/v1/streams", json={"id": "cam", "url": URL}).status_code == 201
        yield c


def send(client: TestClient, method: str, path: str, body: Any) -> Any:
    """`body` as JSON text Python writes (NaN, Infinity, \\ud800 escapes), sent as is."""
    text = json.dumps(body, allow_nan=True)
    return client.request(
        method, path, content=text.encode(), headers={"content-type": "application/json"}
    )


def rendered(r: Any) -> Any:
    assert r.status_code < 500, r.text
    return r.json()  # parses: the answer is valid JSON


ODD = [float("inf"), float("-inf"), float("nan"), 1e999, "\ud800", "a\udfffb", {"\ud800": 1}]


@pytest.mark.parametrize("value", ODD, ids=repr)
@pytest.mark.parametrize(
    "field",
    ["conf_threshold", "iou_threshold", "max_det", "detect_fps", "classes", "id", "url", "gpu"],
)
def test_odd_values_at_stream_fields_are_422(
    app_client: TestClient, field: str, value: Any
) -> None:
    body = {"id": "odd", "url": URL, field: value}
    r = send(app_client, "POST", "/v1/streams", body)
    detail = rendered(r)["detail"]
    assert r.status_code == 422, detail
    assert app_client.get("/v1/streams/odd").status_code == 404
    if field not in ("id", "url"):
        r = send(app_client, "PATCH", "/v1/streams/cam", {field: value})
        assert r.status_code == 422, rendered(r)


@pytest.mark.parametrize("value", ODD, ids=repr)
def test_odd_values_in_zones_are_422(app_client: TestClient, value: Any) -> None:
    for zone in (
        {**SQUARE, "points": [[0.1, 0.1], [value, 0.1], [0.9, 0.9]]},
        {**LINE, "classes": [value]},
    ):
        r = send(app_client, "PUT", "/v1/streams/cam/zones/z", zone)
        assert r.status_code == 422, rendered(r)
        r = send(app_client, "PUT", "/v1/streams/cam/zones", {"zones": [{**zone, "id": "z"}]})
        assert r.status_code == 422, rendered(r)
    assert app_client.get("/v1/streams/cam/zones").json() == {"zones": []}


def test_a_422_excerpt_says_what_was_sent(app_client: TestClient) -> None:
    r = send(app_client, "PATCH", "/v1/streams/cam", {"conf_threshold": float("inf")})
    (issue,) = r.json()["detail"]
    assert issue["loc"] == ["body", "conf_threshold"]
    assert issue["input"] == "inf"
    r = send(app_client, "PATCH", "/v1/streams/cam", {"classes": ["\ud800"]})
    assert "\\ud800" in r.text  # the lone surrogate escaped, readable


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"max_det": True}, "max_det"),
        ({"max_det": 5.0}, "max_det"),
        ({"max_det": "5"}, "max_det"),
        ({"conf_threshold": "0.5"}, "conf_threshold"),
        ({"conf_threshold": True}, "conf_threshold"),
        ({"iou_threshold": "0.5"}, "iou_threshold"),
        ({"detect_fps": "10"}, "detect_fps"),
        ({"class_thresholds": {"person": "0.5"}}, "class_thresholds"),
        ({"tracking": {"enabled": "yes"}}, "tracking"),
        ({"tracking": {"enabled": 1}}, "tracking"),
        ({"tracking": {"lost_track_buffer": 30.0}}, "tracking"),
        ({"tracking": {"track_threshold": "0.5"}}, "tracking"),
        ({"zones": [{**LINE, "id": "l", "classes": [False]}]}, "zones"),
        ({"zones": [{**LINE, "id": "l", "classes": [1.0]}]}, "zones"),
        ({"zones": [{**LINE, "id": "l", "normalized": 1}]}, "zones"),
        ({"zones": [{**LINE, "id": "l", "points": [["0.1", 0.5], [0.9, 0.5]]}]}, "zones"),
        ({"zones": [{**LINE, "id": 5}]}, "zones"),
    ],
)
def test_stream_fields_take_their_own_type_only(
    app_client: TestClient, body: dict[str, Any], field: str
) -> None:
    r = send(app_client, "PATCH", "/v1/streams/cam", body)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"][:2] == ["body", field]
    r = send(app_client, "POST", "/v1/streams", {"id": "typed", "url": URL, **body})
    assert r.status_code == 422, r.text


@pytest.mark.parametrize(
    "body",
    [
        {"id": "t", "url": URL, "loop": 1},
        {"id": "t", "url": URL, "realtime": "false"},
        {"id": "t", "url": URL, "gpu": True},
    ],
)
def test_stream_flags_and_gpu_take_their_own_type_only(
    app_client: TestClient, body: dict[str, Any]
) -> None:
    r = send(app_client, "POST", "/v1/streams", {"id": "t", "url": URL, **body})
    assert r.status_code == 422, r.text


def test_defaults_from_the_environment_stay_text(
    make_settings: MakeSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VDET_DETECTION__CONF_THRESHOLD", "0.35")
    monkeypatch.setenv("VDET_DETECTION__MAX_DET", "50")
    settings_ = make_settings()
    assert (settings_.detection.conf_threshold, settings_.detection.max_det) == (0.35, 50)


# Every body field: (method, path, a valid body, the path to one field in it).
def _field_cases() -> list[tuple[str, str, dict[str, Any], tuple[Any, ...]]]:
    stream = {"id": "prop", "url": URL, "tracking": {}, "zones": [{**LINE, "id": "l"}]}
    zone = dict(SQUARE)
    zones = {"zones": [{**zone, "id": "z"}]}
    cases: list[tuple[str, str, dict[str, Any], tuple[Any, ...]]] = []
    for name in StreamSpec.model_fields:
        cases.append(("POST", "/v1/streams", stream, (name,)))
    for name in StreamChanges.model_fields:
        cases.append(("PATCH", "/v1/streams/cam", {}, (name,)))
    for name in TrackingSpec.model_fields:
        cases.append(("POST", "/v1/streams", stream, ("tracking", name)))
        cases.append(("PATCH", "/v1/streams/cam", {"tracking": {}}, ("tracking", name)))
    for name in ZoneBody.model_fields:
        cases.append(("PUT", "/v1/streams/cam/zones/z", zone, (name,)))
        cases.append(("PUT", "/v1/streams/cam/zones", zones, ("zones", 0, name)))
    cases.append(("PUT", "/v1/streams/cam/zones", zones, ("zones", 0, "id")))
    cases.append(("PUT", "/v1/streams/cam/zones", {}, ("zones",)))
    return cases


FIELD_CASES = _field_cases()
TEXT = st.text(max_size=12) | st.sampled_from(["\ud800", "a\udfffb", "0.5", "true", "", "person"])
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | TEXT
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)


@settings(
    max_examples=400,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=st.sampled_from(FIELD_CASES), value=JSON_VALUES)
def test_random_json_at_any_body_field_never_fails_to_answer(
    app_client: TestClient, case: tuple[str, str, dict[str, Any], tuple[Any, ...]], value: Any
) -> None:
    method, path, valid, where = case
    body = copy.deepcopy(valid)
    target = body
    for key in where[:-1]:
        target = target[key]
    target[where[-1]] = value
    r = send(app_client, method, path, body)
    rendered(r)
    if r.status_code == 201 and method == "POST":
        # The value may itself be a valid id ("true"): remove what was created.
        created = r.json()["id"]
        assert app_client.delete(f"/v1/streams/{created}").status_code == 204
