"""Abuse cases for POST /v1/streams: sources the operator did not allow, text files, and
credentials in URLs (never shown back)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.apptest import MakeSettings, TestClient
from support.redirecting import Listener, http_server, rtsp_redirector
from support.waiting import wait_until

from vdet.api.app import create_app
from vdet.core.redact import DEFAULT_SECRET_PARAMS, use_secret_params
from vdet.ingest.urls import REFUSED_FILE


@pytest.fixture
def locked(make_settings: MakeSettings, tmp_path: Path) -> Iterator[TestClient]:
    """Hosts 10.0.0.0/8 only; files only from tmp_path/videos."""
    (tmp_path / "videos").mkdir()
    settings = make_settings(
        ingest={
            "connect_timeout_s": 0.5,
            "read_timeout_s": 0.5,
            "backoff_initial_s": 5.0,
            "backoff_max_s": 5.0,
            "source_policy": {"hosts": ["10.0.0.0/8"], "file_roots": [tmp_path / "videos"]},
        }
    )
    with TestClient(create_app(settings)) as c:
        yield c


def test_paths_outside_the_roots_all_get_the_same_answer(
    locked: TestClient, tmp_path: Path, clip: Path
) -> None:
    answers = set()
    for url in (str(clip), "/etc/passwd", "/etc", "/no/such/file", str(tmp_path / "videos")):
        r = locked.post("/v1/streams", json={"id": "x", "url": url})
        answers.add((r.status_code, r.json()["detail"]))
    assert answers == {(422, REFUSED_FILE)}


def test_hosts_outside_the_policy_are_refused(locked: TestClient) -> None:
    for url in ("rtsp://127.0.0.1:22/x", "http://169.254.169.254/latest", "rtsp://cam.local/s"):
        r = locked.post("/v1/streams", json={"id": "x", "url": url})
        assert r.status_code == 422
        assert "not allowed on this server" in r.json()["detail"]
    r = locked.post("/v1/streams", json={"id": "x", "url": "rtsp://10.0.0.7:554/s"})
    assert r.status_code == 201


def test_a_text_file_inside_a_root_never_streams(locked: TestClient, tmp_path: Path) -> None:
    text = tmp_path / "videos" / "readme.nfo"
    text.write_text("a private note\n" * 20)
    r = locked.post("/v1/streams", json={"id": "t", "url": str(text)})
    assert r.status_code == 201  # a readable file inside a root: accepted, then refused by FFmpeg

    def failed() -> dict[str, Any] | None:
        status: dict[str, Any] = locked.get("/v1/streams/t").json()["status"]
        return status if status["last_error"] else None

    status = wait_until(failed, 10, what="the text file to be refused")
    assert status["frames_decoded"] == 0
    assert locked.get("/v1/streams/t/snapshot.jpg").status_code == 204


def test_credentials_never_come_back(locked: TestClient) -> None:
    url = "rtsp://admin:hunter22@10.255.255.1:554/stream"
    r = locked.post("/v1/streams", json={"id": "cam", "url": url})
    assert r.status_code == 201
    assert "hunter22" not in r.text
    assert r.json()["spec"]["url"] == "rtsp://***@10.255.255.1:554/stream"
    for path in ("/v1/streams", "/v1/streams/cam"):
        assert "hunter22" not in locked.get(path).text
    # Nor in the 422 of an invalid URL, nor in a validation excerpt.
    bad = {"id": "x", "url": "rtsp://admin:hunter22@10.0.0.7:99999/s"}
    r = locked.post("/v1/streams", json=bad)
    assert r.status_code == 422 and "hunter22" not in r.text
    r = locked.post("/v1/streams", json={"id": "x", "url": url + "a" * 5000})
    assert r.status_code == 422 and "hunter22" not in r.text


def test_secrets_in_query_strings_never_come_back(
    locked: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    url = "http://10.255.255.1/video.cgi?user=admin&password=hunter22&access_token=t0k3n99"
    r = locked.post("/v1/streams", json={"id": "cam", "url": url})
    assert r.status_code == 201
    shown = "http://10.255.255.1/video.cgi?user=admin&password=***&access_token=***"
    assert r.json()["spec"]["url"] == shown

    def failed() -> dict[str, Any] | None:
        status: dict[str, Any] = locked.get("/v1/streams/cam").json()["status"]
        return status if status["last_error"] else None

    wait_until(failed, 10, what="the unreachable source to fail")
    for path in ("/v1/streams", "/v1/streams/cam"):
        text = locked.get(path).text
        assert "hunter22" not in text and "t0k3n99" not in text
    r = locked.post("/v1/streams", json={"id": "x", "url": url + "&x=" + "a" * 5000})
    assert r.status_code == 422 and "hunter22" not in r.text
    assert "hunter22" not in caplog.text and "t0k3n99" not in caplog.text


def test_which_query_parameters_are_secret_is_a_setting(make_settings: MakeSettings) -> None:
    settings = make_settings(secret_query_params=["camkey"])
    try:
        with TestClient(create_app(settings)) as c:
            url = "rtsp://10.0.0.7/s?camkey=abc&password=shown"
            r = c.post("/v1/streams", json={"id": "cam", "url": url})
            assert r.json()["spec"]["url"] == "rtsp://10.0.0.7/s?camkey=***&password=shown"
    finally:
        use_secret_params(DEFAULT_SECRET_PARAMS)  # the process-wide setting, as it was


@pytest.mark.parametrize("scheme", ["http", "rtsp"])
def test_a_redirect_off_the_allowed_hosts_is_refused_and_never_followed(
    make_settings: MakeSettings, scheme: str
) -> None:
    """The source at an allowed host answers 302 to 127.0.0.2, which the policy does not
    allow: the stream fails with the reason, and nothing connects to 127.0.0.2."""
    outsider = Listener("127.0.0.2")
    target = f"{scheme}://127.0.0.2:{outsider.port}/x"
    if scheme == "http":
        url = http_server("127.0.0.1", lambda _: (302, target, None)) + "/video"
    else:
        url = rtsp_redirector("127.0.0.1", target)
    policy = {"hosts": ["127.0.0.1"]}
    settings = make_settings(ingest={"connect_timeout_s": 1.0, "source_policy": policy})
    try:
        with TestClient(create_app(settings)) as c:
            assert c.post("/v1/streams", json={"id": "cam", "url": url}).status_code == 201

            def failed() -> str | None:
                error: str | None = c.get("/v1/streams/cam").json()["status"]["last_error"]
                return error

            error = wait_until(failed, 10, what="the redirect to be refused")
            assert "redirect to" in error and "not allowed" in error, error
            assert c.get("/v1/streams/cam/snapshot.jpg").status_code == 204
    finally:
        outsider.close()
    assert outsider.connections == 0
