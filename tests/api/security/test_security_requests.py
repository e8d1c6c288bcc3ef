"""Abuse cases for request handling: what a request may cost before it is refused.

Each request goes straight to the ASGI app (tests/support/asgi.py) so that the test sees how
much of the body the app read, or to a real uvicorn server where the case is about the
connection itself (a request head that never completes).
"""

from __future__ import annotations

import asyncio
import json
import resource
import socket
import threading
import time
from collections.abc import Iterator, Sequence

import pytest
import uvicorn
from support.apptest import MakeSettings, TestClient
from support.asgi import asgi_request

from vdet.api.app import create_app
from vdet.api.limits import MAX_REPORTED_ERRORS, http_protocol
from vdet.config.limits import LimitSettings
from vdet.core.types import DetectionResult, Detections, StageTimings
from vdet.results.wire import ResultEventEncoder

KEY = "abuse-test-key-0123"
JSON = ("content-type", "application/json")


def test_no_key_is_401_before_a_byte_of_the_body_is_read(make_settings: MakeSettings) -> None:
    app = create_app(make_settings(api_key=KEY))
    chunks = [b"x" * 65536] * 4096  # 256 MiB, if anyone read it

    async def run() -> None:
        for method, path in (("POST", "/v1/streams"), ("POST", "/v1/detect")):
            for headers in ([JSON], [JSON, ("x-api-key", "wrong-key-4567")]):
                answer = await asgi_request(app, method, path, headers, chunks)
                assert (answer.status, answer.chunks_read) == (401, 0)
                assert answer.headers["www-authenticate"] == "Bearer"
        # Declared huge, without a key: still 401, not 413: nothing about the body is looked at.
        big = [JSON, ("content-length", str(1 << 40))]
        answer = await asgi_request(app, "POST", "/v1/streams", big, chunks)
        assert (answer.status, answer.chunks_read) == (401, 0)
        # The open paths stay open.
        assert (await asgi_request(app, "GET", "/healthz")).status == 200
        assert (await asgi_request(app, "GET", "/openapi.json")).status == 200
        # So do the web page's files (they hold no data; the page sends the key itself),
        # but only those: a prefix is not a way around the key.
        for path in ("/", "/ui/app.js"):
            assert (await asgi_request(app, "GET", path)).status == 200, path
        for path in ("/ui", "/uix/app.js", "/v1/workers", "/v1/streams/demo/live.mjpeg"):
            assert (await asgi_request(app, "GET", path)).status == 401, path

    asyncio.run(run())


def test_json_body_over_the_limit_is_413_and_never_buffered(make_settings: MakeSettings) -> None:
    app = create_app(make_settings(limits={"max_json_body_bytes": 4096}))

    async def run() -> None:
        declared = [JSON, ("content-length", "5000")]
        answer = await asgi_request(app, "POST", "/v1/streams", declared, [b"{" * 5000])
        assert (answer.status, answer.chunks_read) == (413, 0)
        assert "4096" in json.loads(answer.body)["detail"]
        chunked = [JSON, ("transfer-encoding", "chunked")]
        answer = await asgi_request(app, "POST", "/v1/streams", chunked, [b" " * 1024] * 1000)
        assert (answer.status, answer.chunks_read) == (413, 5)
        assert answer.headers["connection"] == "close"

    asyncio.run(run())


def test_half_sent_body_is_408_within_the_body_timeout(make_settings: MakeSettings) -> None:
    app = create_app(make_settings(limits={"body_timeout_s": 0.5}))

    async def run() -> None:
        headers = [JSON, ("content-length", "100")]
        started = time.monotonic()
        answer = await asgi_request(
            app, "POST", "/v1/streams", headers, [b'{"id": "a"'], stall_after=1
        )
        assert answer.status == 408
        assert answer.headers["connection"] == "close"
        assert "body_timeout_s" in json.loads(answer.body)["detail"]
        assert time.monotonic() - started < 5.0

    asyncio.run(run())


def test_detect_beyond_the_concurrency_cap_is_503_with_retry_after(
    make_settings: MakeSettings,
) -> None:
    app = create_app(make_settings(limits={"max_concurrent_detect": 2, "body_timeout_s": 2}))
    headers = [("content-type", "image/jpeg"), ("content-length", "1000")]

    async def run() -> None:
        # Two uploads that never finish hold both places...
        hung = [
            asyncio.create_task(
                asgi_request(app, "POST", "/v1/detect", headers, [b"\xff\xd8\xff"], stall_after=1)
            )
            for _ in range(2)
        ]
        await asyncio.sleep(0.05)
        # ... so a third is refused at once, its body unread.
        answer = await asgi_request(app, "POST", "/v1/detect", headers, [b"\xff\xd8\xff"])
        assert (answer.status, answer.chunks_read) == (503, 0)
        assert answer.headers["retry-after"] == "1"
        assert [a.status for a in await asyncio.gather(*hung)] == [408, 408]
        # Places are given back: the next one gets past the cap (and is refused for its body).
        answer = await asgi_request(app, "POST", "/v1/detect", headers, [b"\xff\xd8\xff"])
        assert answer.status != 503 or "max_concurrent_detect" not in answer.body.decode()

    asyncio.run(run())


def test_a_stalled_upload_is_408_and_frees_its_slot_long_before_the_body_timeout(
    make_settings: MakeSettings,
) -> None:
    limits = {"max_concurrent_detect": 1, "body_timeout_s": 60, "body_stall_timeout_s": 0.5}
    app = create_app(make_settings(limits=limits))
    headers = [("content-type", "image/jpeg"), ("content-length", "1000")]

    async def run() -> None:
        started = time.monotonic()
        hung = asyncio.create_task(
            asgi_request(app, "POST", "/v1/detect", headers, [b"\xff\xd8\xff"], stall_after=1)
        )
        await asyncio.sleep(0.05)
        busy = await asgi_request(app, "POST", "/v1/detect", headers, [b"\xff\xd8\xff"])
        assert busy.status == 503
        answer = await hung
        assert answer.status == 408
        assert "body_stall_timeout_s" in json.loads(answer.body)["detail"]
        assert time.monotonic() - started < 3.0
        # A slow sender that keeps sending (0.2 s apart, 1.4 s in all) is not a stalled one.
        slow = [b"x" * 100] * 8
        answer = await asgi_request(app, "POST", "/v1/streams", [JSON], slow, chunk_gap_s=0.2)
        assert answer.status == 422  # its body was read whole, and is not a stream

    asyncio.run(run())


def test_422_for_a_huge_invalid_body_is_short(client: TestClient) -> None:
    # 60 KiB of unknown keys (within the body limit): thousands of issues, a short answer.
    body = json.dumps({f"k{i:05d}": "v" * 8 for i in range(2800)})
    assert len(body) < 64 * 1024
    r = client.post("/v1/streams", content=body, headers=dict([JSON]))
    assert r.status_code == 422
    issues = r.json()["detail"]
    assert len(issues) == MAX_REPORTED_ERRORS + 1
    assert issues[-1]["type"] == "too_many_errors"
    assert len(r.content) < 8 * 1024
    # An invalid long value comes back as an excerpt, not whole.
    r = client.post("/v1/streams", json={"id": "cam", "url": "rtsp://h/" + "a" * 5000})
    assert r.status_code == 422
    assert len(r.content) < 2048
    (issue,) = r.json()["detail"]
    assert issue["loc"] == ["body", "url"]
    assert issue["input"].startswith("rtsp://h/aaa") and len(issue["input"]) <= 80


@pytest.mark.parametrize(
    "body",
    [
        '{"id": "caf\u00e9"}'.encode("latin-1"),
        b'{"id": "\xff\xfe"}',
        "{}".encode("utf-16"),
    ],
)
def test_json_that_is_not_utf8_is_422(client: TestClient, body: bytes) -> None:
    r = client.post("/v1/streams", content=body, headers=dict([JSON]))
    assert r.status_code == 422
    assert "UTF-8" in r.json()["detail"]


@pytest.fixture
def server(make_settings: MakeSettings) -> Iterator[tuple[str, int]]:
    """A real uvicorn on a free port, behind an API key, with vdet's request-head bounds: 0.5 s,
    32 KiB, 100 header lines."""
    limits = LimitSettings(header_timeout_s=0.5)
    config = uvicorn.Config(
        create_app(make_settings(sources=[], api_key=KEY)),
        host="127.0.0.1",
        port=0,
        log_level="warning",
        http=http_protocol(limits),
        lifespan="on",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield "127.0.0.1", port
    finally:
        server.should_exit = True
        thread.join(10)


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


@pytest.mark.parametrize(
    "sent",
    [b"", b"GET /healthz HTTP/1.1\r\nHost: x\r\n", b"GET /heal"],
    ids=["nothing", "half-a-head", "half-a-line"],
)
def test_a_request_head_that_never_completes_is_closed(
    server: tuple[str, int], sent: bytes
) -> None:
    with socket.create_connection(server) as sock:
        sock.sendall(sent)
        assert _closed_within(sock, 5.0)


def test_complete_requests_on_a_kept_alive_connection_are_served(
    server: tuple[str, int],
) -> None:
    with socket.create_connection(server) as sock:
        sock.settimeout(5.0)
        for _ in range(2):
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            reply = sock.recv(4096)
            assert reply.startswith(b"HTTP/1.1 200")
        # The next request's head is timed from its first byte.
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")
        assert _closed_within(sock, 5.0)


def _send_until_refused(sock: socket.socket, head: bytes, filler: bytes, limit: int) -> int:
    """Send `head`, then `filler` again and again (up to `limit` bytes) until the server stops
    taking them; the bytes it took."""
    sock.settimeout(10.0)
    sent = 0
    try:
        sock.sendall(head)
        sent += len(head)
        while sent < limit:
            sock.sendall(filler)
            sent += len(filler)
    except (BrokenPipeError, ConnectionResetError):
        pass
    return sent


def _reply(sock: socket.socket) -> bytes:
    sock.settimeout(10.0)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    return data


@pytest.mark.parametrize(
    ("head", "filler"),
    [
        (b"GET /v1/streams HTTP/1.1\r\nHost: x\r\nX-Big: ", b"a" * 65536),  # one header
        (b"GET /v1/streams HTTP/1.1\r\nHost: x\r\n", b"X-A: b\r\n" * 8192),  # many lines
        (b"GET /v1/streams?" + b"q" * 60000, b"q" * 65536),  # a request line
    ],
    ids=["one-256MiB-header", "header-lines", "request-line"],
)
def test_an_oversized_request_head_is_431_while_it_is_read_before_the_key(
    server: tuple[str, int], head: bytes, filler: bytes
) -> None:
    """A head over `limits.max_head_bytes` (no API key in it) is answered 431 and its connection
    closed after a little more than the bound, not read whole (256 MiB offered)."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with socket.create_connection(server) as sock:
        taken = _send_until_refused(sock, head, filler, 256 << 20)
        reply = _reply(sock)
    assert reply.startswith(b"HTTP/1.1 431 "), reply[:80]
    assert b"limits.max_head_bytes" in reply
    assert taken < 16 << 20  # the kernel's buffers, not the head, decide how much went out
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 100, grown_mb


def test_too_many_header_lines_are_431_and_a_full_normal_head_is_served(
    server: tuple[str, int],
) -> None:
    lines = b"".join(b"X-H%d: v\r\n" % i for i in range(101))
    with socket.create_connection(server) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + lines + b"\r\n")
        assert _reply(sock).startswith(b"HTTP/1.1 431 ")
    # 99 headers and a 20 KiB cookie: under both bounds, served (and the key still checked).
    lines = b"".join(b"X-H%d: v\r\n" % i for i in range(96)) + b"Cookie: " + b"c" * 20000
    with socket.create_connection(server) as sock:
        head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + lines
        sock.sendall(head + b"\r\n\r\n")
        assert _reply(sock).startswith(b"HTTP/1.1 200 ")
    with socket.create_connection(server) as sock:
        sock.sendall(b"GET /v1/streams HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert _reply(sock).startswith(b"HTTP/1.1 401 ")


def test_a_body_strict_json_cannot_echo_is_422_and_the_connection_lives_on(
    server: tuple[str, int],
) -> None:
    """NaN, 1e999 and a lone surrogate used to fail the 422's rendering: a 500 and a reset
    keep-alive connection. Now each is a 422, and the next request on the connection served."""
    bodies = [
        b'{"id":"c","url":"rtsp://10.0.0.7/s","conf_threshold":NaN}',
        b'{"id":"c","url":"rtsp://10.0.0.7/s","detect_fps":1e999}',
        b'{"id":"c","url":"rtsp://10.0.0.7/s","classes":["\\ud800"]}',
    ]
    with socket.create_connection(server) as sock:
        sock.settimeout(5.0)
        for body in bodies:
            head = (
                b"POST /v1/streams HTTP/1.1\r\nHost: x\r\nX-API-Key: "
                + KEY.encode()
                + b"\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
            )
            sock.sendall(head + body)
            reply = sock.recv(65536)
            assert reply.startswith(b"HTTP/1.1 422 "), reply[:200]
            json.loads(reply.split(b"\r\n\r\n", 1)[1])
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(4096).startswith(b"HTTP/1.1 200 ")


class _ThreadRecordingEncoder(ResultEventEncoder):
    def __init__(self) -> None:
        super().__init__()
        self.threads: set[str] = set()

    def encode_many(self, results: Sequence[DetectionResult], names: Sequence[str]) -> list[str]:
        self.threads.add(threading.current_thread().name)
        return super().encode_many(results, names)


def test_a_replay_is_encoded_off_the_event_loop(client: TestClient) -> None:
    rt = client.app.state.service
    # Nobody subscribes while these are published, so none is encoded ahead (hub.on_publish).
    encoder = client.app.state.encoder = _ThreadRecordingEncoder()
    dets = Detections.empty()
    for index in range(300):
        rt.hub.publish(
            DetectionResult("all", index, None, time.time(), 0.0, (64, 48), dets, StageTimings())
        )
    with client.websocket_connect("/v1/events?after=0") as ws:
        seqs = [ws.receive_json()["result"]["seq"] for _ in range(300)]
    assert seqs == list(range(1, 301))
    assert encoder.threads and all(name.startswith("ws-replay") for name in encoder.threads)
