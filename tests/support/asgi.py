"""Requests sent straight to an ASGI app, to see what the app itself reads and when.

TestClient buffers a whole request body before the app runs; these helpers hand the app a
`receive` that counts the body chunks it takes, or never delivers the rest of the body.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class AsgiAnswer:
    status: int
    body: bytes
    headers: dict[str, str]
    chunks_read: int = 0
    sent: list[dict[str, Any]] = field(default_factory=list)


async def asgi_request(
    app: Any,
    method: str,
    path: str,
    headers: Sequence[tuple[str, str]] = (),
    chunks: Sequence[bytes] = (),
    *,
    stall_after: int | None = None,
    chunk_gap_s: float = 0.0,
) -> AsgiAnswer:
    """Send a request of `chunks` to `app`; with `stall_after`, the body stops after that
    many chunks and never finishes (a half-sent body); `chunk_gap_s` apart (a slow sender)."""
    read = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal read
        if stall_after is not None and read >= stall_after:
            await asyncio.Event().wait()  # never
        if read < len(chunks):
            if read and chunk_gap_s:
                await asyncio.sleep(chunk_gap_s)
            read += 1
            return {"type": "http.request", "body": chunks[read - 1], "more_body": True}
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    path_only, _, query = path.partition("?")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path_only,
        "raw_path": path_only.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [(b"host", b"testserver")]
        + [(k.lower().encode(), v.encode()) for k, v in headers],
        "client": ("127.0.0.1", 1234),
        "server": ("testserver", 80),
        "app": app,
    }
    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    response_headers = {k.decode().lower(): v.decode() for k, v in start.get("headers", [])}
    return AsgiAnswer(start["status"], body, response_headers, read, sent)
