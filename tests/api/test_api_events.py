"""WebSocket event feeds: replay, live delivery, resume without gaps or duplicates, refusals."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from starlette.websockets import WebSocketDisconnect
from support.apptest import (
    MakeSettings,
    TestClient,
    WebSocketDenialResponse,
    stream_body,
)
from support.waiting import wait_until

from vdet.api.app import create_app


def read_results(ws: Any, n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    while len(out) < n:
        message = ws.receive_json()
        assert message["type"] == "result", message
        out.append(message["result"])
    return out


def last_seq(client: TestClient, stream_id: str = "cam") -> int:
    def seq() -> int:
        r = client.get(f"/v1/streams/{stream_id}/detections")
        return int(r.json()["seq"]) if r.status_code == 200 else 0

    return wait_until(seq, 10, what="a first result")


@pytest.mark.parametrize("path", ["/v1/streams/cam/events", "/v1/events"])
def test_resume_continues_without_gaps_or_duplicates(
    client: TestClient, clip: Path, path: str
) -> None:
    assert client.post("/v1/streams", json=stream_body(clip)).status_code == 201
    with client.websocket_connect(f"{path}?after=0") as ws:
        first = read_results(ws, 5)
    seqs = [r["seq"] for r in first]
    assert seqs == list(range(1, 6))  # replayed from the start of the buffer

    time.sleep(0.3)  # results keep coming while the client is away
    with client.websocket_connect(f"{path}?after={seqs[-1]}") as ws:
        resumed = read_results(ws, 20)
    seqs += [r["seq"] for r in resumed]
    assert seqs == list(range(1, len(seqs) + 1))
    frames = [r["frame_index"] for r in first + resumed]
    assert len(set(frames)) == len(frames)


def test_all_streams_feed_interleaves_sources_in_seq_order(client: TestClient, clip: Path) -> None:
    for stream_id in ("a", "b"):
        assert client.post("/v1/streams", json=stream_body(clip, stream_id)).status_code == 201
    with client.websocket_connect("/v1/events?after=0") as ws:
        results = read_results(ws, 30)
    assert [r["seq"] for r in results] == list(range(1, 31))
    assert {r["source_id"] for r in results} == {"a", "b"}
    with client.websocket_connect("/v1/streams/b/events?after=0") as ws:
        only_b = read_results(ws, 10)
    assert {r["source_id"] for r in only_b} == {"b"}
    seqs = [r["seq"] for r in only_b]
    assert seqs == sorted(set(seqs))


def test_without_after_only_new_results_are_sent(client: TestClient, clip: Path) -> None:
    assert client.post("/v1/streams", json=stream_body(clip)).status_code == 201
    before = last_seq(client)
    with client.websocket_connect("/v1/streams/cam/events") as ws:
        live = read_results(ws, 3)
    assert live[0]["seq"] > before
    assert [r["seq"] for r in live] == list(range(live[0]["seq"], live[0]["seq"] + 3))


def test_gap_message_when_the_requested_seq_left_the_buffer(
    make_settings: MakeSettings, clip: Path
) -> None:
    settings = make_settings(hub={"capacity_per_source": 4, "capacity_total": 4})
    with TestClient(create_app(settings)) as client:
        assert client.post("/v1/streams", json=stream_body(clip)).status_code == 201
        wait_until(lambda: last_seq(client) > 8, 10, what="results to overflow the buffer")
        for path in ("/v1/streams/cam/events", "/v1/events"):
            with client.websocket_connect(f"{path}?after=1") as ws:
                gap = ws.receive_json()
                assert gap["type"] == "gap"
                assert gap["requested_after"] == 1
                assert gap["oldest_seq"] > 2
                replayed = read_results(ws, 4)
            assert replayed[0]["seq"] == gap["oldest_seq"]
            assert [r["seq"] for r in replayed] == list(
                range(gap["oldest_seq"], gap["oldest_seq"] + 4)
            )


def test_a_seq_from_before_a_restart_gets_a_gap_and_everything_kept(
    client: TestClient, clip: Path
) -> None:
    assert client.post("/v1/streams", json=stream_body(clip)).status_code == 201
    last_seq(client)
    with client.websocket_connect("/v1/events?after=999999") as ws:
        gap = ws.receive_json()
        assert gap == {"type": "gap", "requested_after": 999999, "oldest_seq": 1}
        assert read_results(ws, 1)[0]["seq"] == 1


def test_deleting_the_stream_ends_its_feed_with_a_resume_point(
    client: TestClient, clip: Path
) -> None:
    assert client.post("/v1/streams", json=stream_body(clip)).status_code == 201
    with client.websocket_connect("/v1/streams/cam/events?after=0") as ws:
        seen = read_results(ws, 2)
        assert client.delete("/v1/streams/cam").status_code == 204
        while True:
            message = ws.receive_json()
            if message["type"] != "result":
                break
            seen.append(message["result"])
        assert message == {"type": "stream_removed", "resume_after": seen[-1]["seq"]}
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json()
        assert closed.value.code == 1000


def test_connected_clients_are_counted_in_metrics(client: TestClient, clip: Path) -> None:
    def clients() -> float:
        for line in client.get("/metrics").text.splitlines():
            if line.startswith("vdet_websocket_clients "):
                return float(line.split()[1])
        raise AssertionError("vdet_websocket_clients missing")

    assert client.post("/v1/streams", json=stream_body(clip)).status_code == 201
    with client.websocket_connect("/v1/events") as ws:
        read_results(ws, 1)
        assert clients() == 1.0
    wait_until(lambda: clients() == 0.0, 5, what="the client to be uncounted")


@pytest.mark.parametrize(
    ("path", "status", "fragment"),
    [
        ("/v1/streams/nope/events", 404, "no stream 'nope'"),
        ("/v1/events?after=abc", 422, "after"),
        ("/v1/events?after=-1", 422, "after"),
    ],
)
def test_handshake_refusals_are_http_errors(
    client: TestClient, path: str, status: int, fragment: str
) -> None:
    with pytest.raises(WebSocketDenialResponse) as denied, client.websocket_connect(path):
        pass
    assert denied.value.status_code == status
    assert fragment in denied.value.json()["detail"]
