"""The documented WebSocket goodbyes: `lagging` for a client that stops reading, `shutdown`
for every client when the server is stopped with SIGTERM (which then exits 0)."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.apptest import MakeSettings, TestClient, WebSocketDenialResponse
from support.procs import Process, wait_http_ok
from support.rtsp import free_port
from support.waiting import wait_until
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from vdet.api.app import create_app
from vdet.api.server import GracefulServer, server_config
from vdet.core.types import DetectionResult, Detections, StageTimings


def _big_result(index: int) -> DetectionResult:
    n = 300
    xyxy = np.tile(np.array([[1.0, 2.0, 30.0, 40.0]], np.float32), (n, 1))
    dets = Detections(xyxy, np.full(n, 0.5, np.float32), np.zeros(n, np.int64))
    return DetectionResult("cam", index, None, time.time(), 0.0, (640, 480), dets, StageTimings())


def _read_until_closed(ws: ClientConnection) -> tuple[list[dict[str, Any]], int | None]:
    """Every message until the server closes, and its close code."""
    messages: list[dict[str, Any]] = []
    try:
        while True:
            messages.append(json.loads(ws.recv(timeout=10)))
    except ConnectionClosed as closed:
        return messages, closed.rcvd.code if closed.rcvd is not None else None


@pytest.fixture
def served(make_settings: MakeSettings) -> Iterator[tuple[int, object]]:
    """A real uvicorn (vdet's GracefulServer) on a free port; yields (port, app)."""
    # A queue longer than the test's burst: a client ends lagging by the send timeout here,
    # not by its queue filling up (that path has its own tests).
    app = create_app(make_settings(hub={"send_timeout_s": 2.0, "subscriber_queue_size": 4096}))
    # As `vdet serve` runs it: uncompressed (compressed, the repetitive test results would fit
    # in the socket buffers whole), frames written once per loop pass.
    config = server_config(app)
    server = GracefulServer(config, app)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not (server.started and app.state.service.ready):
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.05)
    try:
        yield server.servers[0].sockets[0].getsockname()[1], app
    finally:
        server.should_exit = True
        thread.join(15)


def test_a_client_that_stops_reading_gets_lagging_with_its_resume_point(
    served: tuple[int, object],
) -> None:
    port, app = served
    hub = app.state.service.hub  # type: ignore[attr-defined]
    # A small receive buffer set before connecting (which turns off the kernel's buffer
    # growth, up to 32 MB on loopback): ~20 MB of results cannot all be in flight.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    sock.connect(("127.0.0.1", port))
    with connect(f"ws://127.0.0.1:{port}/v1/events", sock=sock, max_queue=1, max_size=None) as ws:
        time.sleep(0.2)
        for index in range(600):  # ~20 MB of JSON: more than the socket buffers hold
            hub.publish(_big_result(index))
        # Not reading until the server has given up on the client: a send has waited 2 s.
        wait_until(lambda: hub.subscriber_count == 0, 30, what="the client's send timeout")
        messages, code = _read_until_closed(ws)
    last = messages[-1]
    assert last["type"] == "lagging"
    results = [m["result"]["seq"] for m in messages if m["type"] == "result"]
    assert last["resume_after"] == results[-1]
    assert results == list(range(results[0], results[-1] + 1))  # nothing skipped before it
    assert code == 1013


def test_a_client_that_never_reads_again_is_disconnected(served: tuple[int, object]) -> None:
    port, app = served
    runtime = app.state.service  # type: ignore[attr-defined]
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    sock.connect(("127.0.0.1", port))
    # close_timeout: this client reads nothing, so it would wait its whole closing handshake.
    with connect(
        f"ws://127.0.0.1:{port}/v1/events", sock=sock, max_queue=1, max_size=None, close_timeout=1
    ):
        time.sleep(0.2)
        for index in range(600):
            runtime.hub.publish(_big_result(index))
        # The send timeout, then one more for the waiting message: the server lets go.
        wait_until(
            lambda: runtime.metrics.registry.get_sample_value("vdet_websocket_clients") == 0,
            30,
            what="the server dropping a client that reads nothing",
        )


def test_sigterm_says_goodbye_to_every_client_and_exits_0(tmp_path: Path) -> None:
    port = free_port()
    process = Process(
        [sys.executable, "-m", "vdet.cli", "serve", "--port", str(port)],
        tmp_path / "serve.log",
    )
    try:
        wait_http_ok(process, f"http://127.0.0.1:{port}/readyz", 60)
        with contextlib.ExitStack() as stack:
            url = f"ws://127.0.0.1:{port}/v1/events"
            clients = [stack.enter_context(connect(url)) for _ in range(3)]
            for ws in clients:
                assert json.loads(ws.recv(timeout=10))["type"] == "result"
            started = time.monotonic()
            process.popen.send_signal(signal.SIGTERM)
            for ws in clients:
                messages, code = _read_until_closed(ws)
                assert messages[-1]["type"] == "shutdown", messages[-1]
                assert messages[-1]["resume_after"] >= 1
                assert code == 1001
        assert process.popen.wait(timeout=10) == 0, process.log_tail()
        assert time.monotonic() - started < 10
    finally:
        process.stop()


def test_websocket_clients_are_capped_per_stream_and_in_all(make_settings: MakeSettings) -> None:
    """Up to the caps clients are served; beyond, a 503 that names the setting; a client that
    leaves gives its seat back."""
    limits = {"max_websocket_clients": 5, "max_websocket_clients_per_stream": 3}
    with TestClient(create_app(make_settings(limits=limits))) as client, ExitStack() as open_:
        for stream_id in ("a", "b"):
            body = {"id": stream_id, "url": "rtsp://10.0.0.7/s"}
            assert client.post("/v1/streams", json=body).status_code == 201

        def refused(path: str) -> str:
            with pytest.raises(WebSocketDenialResponse) as denied, client.websocket_connect(path):
                pass
            assert denied.value.status_code == 503
            detail: str = denied.value.json()["detail"]
            return detail

        first = open_.enter_context(client.websocket_connect("/v1/streams/a/events"))
        for _ in range(2):
            open_.enter_context(client.websocket_connect("/v1/streams/a/events"))
        assert "max_websocket_clients_per_stream" in refused("/v1/streams/a/events")
        for _ in range(2):
            open_.enter_context(client.websocket_connect("/v1/events"))
        assert "(limits.max_websocket_clients)" in refused("/v1/streams/b/events")
        first.close()
        wait_until(lambda: client.app.state.websocket_seats.taken["a"] == 2, 5, what="a seat back")
        open_.enter_context(client.websocket_connect("/v1/streams/b/events"))
