"""Inputs that used to be taken for something else: dot-segment ids, booleans as class ids."""

from __future__ import annotations

from typing import Any

import pytest
from support.apptest import TestClient

URL = "rtsp://10.0.0.7/s"


@pytest.mark.parametrize("stream_id", [".", ".."])
def test_dot_segment_ids_are_refused(client: TestClient, stream_id: str) -> None:
    r = client.post("/v1/streams", json={"id": stream_id, "url": URL})
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["body", "id"]


def test_ids_with_dots_inside_are_fine(client: TestClient) -> None:
    for stream_id in ("a.b", "...", ".hidden"):
        assert client.post("/v1/streams", json={"id": stream_id, "url": URL}).status_code == 201


@pytest.mark.parametrize("classes", [[False], [True], [1.0], [0, None], [""], [[0]]])
def test_class_refs_are_names_or_integers_only(client: TestClient, classes: list[Any]) -> None:
    r = client.post("/v1/streams", json={"id": "cam", "url": URL, "classes": classes})
    assert r.status_code == 422, r.text
    assert client.post("/v1/streams", json={"id": "cam", "url": URL}).status_code == 201
    r = client.patch("/v1/streams/cam", json={"classes": classes})
    assert r.status_code == 422, r.text
    r = client.patch("/v1/streams/cam", json={"classes": [0, "car"]})
    assert r.json()["effective"]["classes"] == ["person", "car"]


def test_a_url_is_stored_without_surrounding_whitespace(client: TestClient) -> None:
    r = client.post("/v1/streams", json={"id": "cam", "url": f" {URL}\t\n"})
    assert (r.status_code, r.json()["spec"]["url"]) == (201, URL)
    r = client.post("/v1/streams", json={"id": "blank", "url": " \n"})
    assert r.status_code == 422
