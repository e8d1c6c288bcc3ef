"""WebSocket frames written once per event-loop pass (vdet.api.ws_writes).

The transport under the protocol is a recording stand-in for the socket's (what the kernel
does with the bytes is not the point here); the end-to-end test runs a real uvicorn with the
settings `vdet serve` uses and a real websockets client."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI, WebSocket
from websockets.exceptions import ConnectionClosedOK
from websockets.sync.client import connect

from vdet.api.server import server_config
from vdet.api.ws_writes import FLUSH_BYTES, CoalescingTransport


class RecordingTransport(asyncio.Transport):
    """Records each write the coalescing transport hands on, and closes."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.events: list[str] = []
        self.closing = False

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))
        self.events.append("write")

    def close(self) -> None:
        self.closing = True
        self.events.append("close")

    def abort(self) -> None:
        self.closing = True
        self.events.append("abort")

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return 0


async def test_writes_of_one_loop_pass_reach_the_socket_as_one_in_order() -> None:
    inner = RecordingTransport()
    transport = CoalescingTransport(inner, asyncio.get_running_loop())
    for i in range(50):
        transport.write(f"frame{i};".encode())
    assert inner.writes == [] and transport.get_write_buffer_size() > 0
    await asyncio.sleep(0)
    assert inner.writes == ["".join(f"frame{i};" for i in range(50)).encode()]
    transport.write(b"next")
    await asyncio.sleep(0)
    assert inner.writes[1:] == [b"next"]


async def test_a_large_burst_goes_out_in_bounded_pieces() -> None:
    inner = RecordingTransport()
    transport = CoalescingTransport(inner, asyncio.get_running_loop())
    piece = b"x" * 1000
    count = 3 * FLUSH_BYTES // len(piece)
    for _ in range(count):
        transport.write(piece)
    assert len(inner.writes) >= 2  # written before the pass ended, past FLUSH_BYTES each
    assert all(len(w) < FLUSH_BYTES + len(piece) for w in inner.writes)
    await asyncio.sleep(0)
    assert b"".join(inner.writes) == piece * count


async def test_close_writes_what_is_buffered_first_and_abort_drops_it() -> None:
    loop = asyncio.get_running_loop()
    inner = RecordingTransport()
    transport = CoalescingTransport(inner, loop)
    transport.write(b"close frame")
    transport.close()
    assert inner.events == ["write", "close"] and inner.writes == [b"close frame"]
    await asyncio.sleep(0)
    assert inner.events == ["write", "close"]  # nothing written after the close

    inner = RecordingTransport()
    transport = CoalescingTransport(inner, loop)
    transport.write(b"never")
    transport.abort()
    await asyncio.sleep(0)
    assert inner.events == ["abort"]


async def test_nothing_is_written_to_a_transport_closed_under_it() -> None:
    inner = RecordingTransport()
    transport = CoalescingTransport(inner, asyncio.get_running_loop())
    transport.write(b"late")
    inner.closing = True  # the peer went away
    await asyncio.sleep(0)
    assert inner.writes == []


def test_a_burst_of_messages_arrives_whole_and_in_order_through_vdet_s_server() -> None:
    app = FastAPI()
    count = 5000

    @app.websocket("/burst")
    async def burst(ws: WebSocket) -> None:
        await ws.accept()
        for i in range(count):
            await ws.send_text(f"message {i} " + "x" * (i % 300))
        await ws.receive_text()  # the client's "done", after its ping
        await ws.close(1000)

    server = uvicorn.Server(server_config(app))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        with connect(f"ws://127.0.0.1:{port}/burst") as client:
            got = [client.recv(timeout=10) for _ in range(count)]
            assert client.ping().wait(10)  # control frames still flow
            client.send("done")
            with pytest.raises(ConnectionClosedOK):
                client.recv(timeout=10)
        assert got == [f"message {i} " + "x" * (i % 300) for i in range(count)]
        assert client.close_code == 1000
    finally:
        server.should_exit = True
        thread.join(10)
