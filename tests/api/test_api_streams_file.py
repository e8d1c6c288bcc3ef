"""`streams_file` end to end: what the API changes survives a restart of the app (the real
app, ONNX Runtime, real H.264 files), the config file wins once edited, and a file that cannot
be written or read is reported without losing what was accepted."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import onnx
import pytest
from support.apptest import MakeSettings, TestClient, stream_body
from support.rtsp import free_port

from vdet.api.app import create_app
from vdet.config.settings import Settings

ZONE = {"kind": "polygon", "points": [[0, 0], [0.5, 0], [0.5, 1], [0, 1]]}


def spec_of(client: TestClient, stream_id: str) -> dict[str, Any]:
    r = client.get(f"/v1/streams/{stream_id}")
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()["spec"]
    return body


def ids(client: TestClient) -> list[str]:
    return [s["id"] for s in client.get("/v1/streams").json()["streams"]]


def test_streams_added_and_changed_over_the_api_start_again_after_a_restart(
    make_settings: MakeSettings, clip: Path, tmp_path: Path
) -> None:
    settings = make_settings(streams_file=tmp_path / "streams.json")
    with TestClient(create_app(settings)) as client:
        assert client.post("/v1/streams", json=stream_body(clip, "yard")).status_code == 201
        r = client.patch("/v1/streams/yard", json={"conf_threshold": 0.6, "detect_fps": 5})
        assert r.status_code == 200, r.text
        assert client.put("/v1/streams/yard/zones/door", json=ZONE).status_code == 201
        before = spec_of(client, "yard")
        assert client.post("/v1/streams", json=stream_body(clip, "gone")).status_code == 201
        assert client.delete("/v1/streams/gone").status_code == 204

    with TestClient(create_app(settings)) as client:
        assert ids(client) == ["yard"]
        after = spec_of(client, "yard")
        assert after == before
        assert after["conf_threshold"] == 0.6 and after["detect_fps"] == 5
        assert [z["id"] for z in after["zones"]] == ["door"]
        ready = client.get("/readyz").json()
        assert (ready["sources_configured"], ready["sources_restored"]) == (0, 1)
        # It runs, not only lists: the restored stream's frames are detected again.
        r = client.get("/v1/streams/yard")
        assert r.json()["status"]["state"] in {"connecting", "streaming"}


def test_a_configured_source_keeps_its_api_changes_until_its_config_entry_is_edited(
    make_settings: MakeSettings, clip: Path, tmp_path: Path
) -> None:
    path = tmp_path / "streams.json"
    gate = stream_body(clip, "gate")
    settings = make_settings(streams_file=path, sources=[gate])
    with TestClient(create_app(settings)) as client:
        assert client.patch("/v1/streams/gate", json={"conf_threshold": 0.7}).status_code == 200

    with TestClient(create_app(settings)) as client:
        assert spec_of(client, "gate")["conf_threshold"] == 0.7
        assert client.get("/readyz").json()["sources_started"] == 1

    edited = make_settings(streams_file=path, sources=[{**gate, "iou_threshold": 0.5}])
    with TestClient(create_app(edited)) as client:
        spec = spec_of(client, "gate")
        assert (spec["conf_threshold"], spec["iou_threshold"]) == (None, 0.5)
    # The file now holds the config's version: the older change is gone for good.
    (stored,) = json.loads(path.read_text())["streams"]
    assert stored["spec"]["conf_threshold"] is None


def test_a_configured_source_removed_over_the_api_stays_removed_after_a_restart(
    make_settings: MakeSettings, clip: Path, tmp_path: Path
) -> None:
    path = tmp_path / "streams.json"
    sources = [stream_body(clip, "gate"), stream_body(clip, "dock")]
    settings = make_settings(streams_file=path, sources=sources)
    with TestClient(create_app(settings)) as client:
        assert client.delete("/v1/streams/dock").status_code == 204

    with TestClient(create_app(settings)) as client:
        assert ids(client) == ["gate"]
        # Added again over the API: no longer removed.
        assert client.post("/v1/streams", json=sources[1]).status_code == 201

    with TestClient(create_app(settings)) as client:
        assert ids(client) == ["dock", "gate"]


def test_credentials_are_kept_in_the_file_and_hidden_in_the_api(
    make_settings: MakeSettings, tmp_path: Path
) -> None:
    path = tmp_path / "streams.json"
    url = f"rtsp://admin:hunter22@127.0.0.1:{free_port()}/cam"  # never answers: retried
    with TestClient(create_app(make_settings(streams_file=path))) as client:
        assert client.post("/v1/streams", json={"id": "cam", "url": url}).status_code == 201
        assert "hunter22" not in client.get("/v1/streams/cam").text
    assert json.loads(path.read_text())["streams"][0]["spec"]["url"] == url
    with TestClient(create_app(make_settings(streams_file=path))) as client:
        assert "***" in spec_of(client, "cam")["url"]


def test_a_change_that_cannot_be_written_is_kept_counted_and_written_with_the_next(
    make_settings: MakeSettings, clip: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "state"
    folder.mkdir()
    settings = make_settings(streams_file=folder / "streams.json")
    with TestClient(create_app(settings)) as client:
        shutil.rmtree(folder)  # the volume went away under the running service
        with caplog.at_level(logging.ERROR, logger="vdet.streams.store"):
            r = client.post("/v1/streams", json=stream_body(clip, "yard"))
        assert r.status_code == 201, r.text
        assert ids(client) == ["yard"]
        assert "could not write the streams file" in caplog.text
        metrics = client.get("/metrics").text
        assert "vdet_streams_file_write_failures_total 1.0" in metrics

        folder.mkdir()
        assert client.patch("/v1/streams/yard", json={"max_det": 10}).status_code == 200
    stored = json.loads((folder / "streams.json").read_text())["streams"]
    assert [(s["id"], s["spec"]["max_det"]) for s in stored] == [("yard", 10)]


def test_a_stream_from_the_file_that_no_longer_starts_is_left_out_and_the_rest_start(
    make_settings: MakeSettings, clip: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "streams.json"
    with TestClient(create_app(make_settings(streams_file=path))) as client:
        assert client.post("/v1/streams", json=stream_body(clip, "file")).status_code == 201
        url = f"rtsp://127.0.0.1:{free_port()}/cam"
        assert client.post("/v1/streams", json={"id": "cam", "url": url}).status_code == 201

    # Restarted with a policy that allows RTSP only: the file source is refused now.
    strict: Settings = make_settings(
        streams_file=path, ingest={"source_policy": {"schemes": ["rtsp"]}}
    )
    with (
        caplog.at_level(logging.ERROR, logger="vdet.root"),
        TestClient(create_app(strict)) as client,
    ):
        assert ids(client) == ["cam"]
        assert client.get("/readyz").json()["sources_restored"] == 1
    assert "stream 'file' from the streams file does not start" in caplog.text
    assert [s["id"] for s in json.loads(path.read_text())["streams"]] == ["cam"]


def test_an_unreadable_streams_file_stops_the_start_with_its_name_and_the_problem(
    make_settings: MakeSettings, tmp_path: Path
) -> None:
    path = tmp_path / "streams.json"
    path.write_text('{"version": 1, "streams": [{"id": "a"}]}')
    with (
        pytest.raises(RuntimeError, match="invalid streams file") as raised,
        TestClient(create_app(make_settings(streams_file=path))),
    ):
        pass
    assert str(path) in str(raised.value)
    assert path.read_text() == '{"version": 1, "streams": [{"id": "a"}]}'  # left for the operator


def test_a_second_service_on_the_same_streams_file_refuses_to_start(
    make_settings: MakeSettings, clip: Path, tmp_path: Path
) -> None:
    """Two services on one file would each overwrite the other's changes: the second stops at
    start-up, naming the file, and the first keeps running and writing it; once the first has
    stopped, a new one starts on it."""
    path = tmp_path / "streams.json"
    settings = make_settings(streams_file=path)
    with TestClient(create_app(settings)) as first:
        with (
            pytest.raises(RuntimeError, match="in use by another vdet") as raised,
            TestClient(create_app(settings)),
        ):
            pass
        assert str(path) in str(raised.value)
        assert first.post("/v1/streams", json=stream_body(clip, "yard")).status_code == 201
    assert [s["id"] for s in json.loads(path.read_text())["streams"]] == ["yard"]
    with TestClient(create_app(settings)) as again:
        assert ids(again) == ["yard"]


def test_a_configured_source_whose_kept_changes_no_longer_start_runs_as_configured(
    make_settings: MakeSettings,
    clip: Path,
    tiny_model: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    path = tmp_path / "streams.json"
    gate = stream_body(clip, "gate")
    with TestClient(create_app(make_settings(streams_file=path, sources=[gate]))) as client:
        assert client.patch("/v1/streams/gate", json={"classes": ["dog"]}).status_code == 200

    # The same model with class 2 renamed: the kept class filter names a class it lacks.
    model = onnx.load(str(tiny_model))
    for prop in model.metadata_props:
        if prop.key == "names":
            prop.value = repr({0: "person", 1: "car", 2: "cat"})
    onnx.save(model, str(renamed := tmp_path / "renamed.onnx"))
    settings = make_settings(streams_file=path, sources=[gate], model_path=renamed)
    with (
        caplog.at_level(logging.ERROR, logger="vdet.root"),
        TestClient(create_app(settings)) as client,
    ):
        assert spec_of(client, "gate")["classes"] is None
        assert client.get("/readyz").json()["sources_started"] == 1
    assert "the config file's entry is started instead" in caplog.text
