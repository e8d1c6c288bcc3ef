"""What one HTTP request may cost: checks made before routing, reading or parsing it.

`RequestGuard`, an ASGI middleware in front of every route, answers in this order and reads
no byte of a body before the checks that can refuse it without one:

1. the API key (when one is set) on every path but the open ones (`OPEN_PATHS`,
   `OPEN_PREFIXES`): 401;
2. `POST /v1/detect` beyond `limits.max_concurrent_detect` requests at once: 503 with
   `Retry-After`, counted from the request head to the response;
3. a declared `Content-Length` over the route's body limit (`max_upload_bytes` for
   /v1/detect, else `limits.max_json_body_bytes`): 413;
4. the body itself, read here: counted (413 at the limit, never buffered beyond it), and due
   whole within `limits.body_timeout_s` of the request head (408, connection closed); a
   JSON body must be UTF-8 (422). The app then gets the body in one piece.

A bounded JSON body bounds the cost of parsing and validating it on the event loop.
`validation_error_response` answers FastAPI's 422s with at most `MAX_REPORTED_ERRORS`
issues, each with a short excerpt of the input instead of the input itself.

Before any of that, a connection must send its request head: uvicorn has a keep-alive timeout
but none for a head that never completes, so `http_protocol` gives uvicorn's httptools
protocol one (`limits.header_timeout_s`). This module limits cost; who may call what is
`auth.py`, and the routes' own validation stays theirs.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vdet.api.auth import headers_carry_key
from vdet.config.settings import Settings
from vdet.core.redact import redact

log = logging.getLogger(__name__)

DETECT_PATH = "/v1/detect"
# Never behind the API key: probes, metrics, the API's own description and the web page's
# files (vdet.api.routes_ui: they hold no data; the page sends the key with its API calls).
OPEN_PATHS = frozenset(
    {
        "/",
        "/healthz",
        "/readyz",
        "/metrics",
        "/docs",
        "/docs/oauth2-redirect",
        "/redoc",
        "/openapi.json",
    }
)
OPEN_PREFIXES = ("/ui/",)
MAX_REPORTED_ERRORS = 20
EXCERPT_CHARS = 80


def install(app: FastAPI, settings: Settings) -> None:
    """Put the request guard in front of `app`'s routes and bound its 422 answers."""
    app.add_middleware(RequestGuard, settings=settings)
    app.add_exception_handler(RequestValidationError, validation_error_response)


class RequestGuard:
    """ASGI middleware enforcing the checks of the module docstring on HTTP requests."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.limits = settings.limits
        self.max_upload_bytes = settings.max_upload_bytes
        self.api_key = None if settings.api_key is None else settings.api_key.get_secret_value()
        self.detects_running = 0  # touched on the event loop only

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        path: str = scope["path"]
        if (
            self.api_key is not None
            and path not in OPEN_PATHS
            and not path.startswith(OPEN_PREFIXES)
            and not headers_carry_key(headers, self.api_key)
        ):
            await _answer(
                scope,
                send,
                401,
                "missing or invalid API key (send X-API-Key or Authorization: Bearer)",
                {"WWW-Authenticate": "Bearer"},
            )
            return
        is_detect = path == DETECT_PATH and scope["method"] == "POST"
        if not is_detect:
            await self._guard_body(scope, receive, send, headers, self.limits.max_json_body_bytes)
            return
        if self.detects_running >= self.limits.max_concurrent_detect:
            await _answer(
                scope,
                send,
                503,
                f"{self.detects_running} images are being detected, the most this server "
                "takes at once (limits.max_concurrent_detect); retry shortly",
                {"Retry-After": str(self.limits.retry_after_s)},
            )
            return
        self.detects_running += 1
        try:
            await self._guard_body(scope, receive, send, headers, self.max_upload_bytes)
        finally:
            self.detects_running -= 1

    async def _guard_body(
        self, scope: Scope, receive: Receive, send: Send, headers: Headers, limit: int
    ) -> None:
        declared = headers.get("content-length")
        if declared is None and "transfer-encoding" not in headers:
            await self.app(scope, receive, send)  # no body
            return
        if declared is not None:
            try:
                length = int(declared)
            except ValueError:
                await _answer(scope, send, 400, "invalid Content-Length header")
                return
            if length > limit:
                await _answer(scope, send, 413, _too_large(limit))
                return
        body = bytearray()
        try:
            async with asyncio.timeout(self.limits.body_timeout_s):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return  # nobody left to answer
                    body += message.get("body", b"")
                    if len(body) > limit:
                        await _answer(scope, send, 413, _too_large(limit), close=True)
                        return
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            await _answer(
                scope,
                send,
                408,
                f"the request body did not arrive within {self.limits.body_timeout_s:g} s "
                "(limits.body_timeout_s)",
                close=True,
            )
            return
        if body and _is_json(headers):
            try:
                bytes(body).decode("utf-8")
            except UnicodeDecodeError as exc:
                await _answer(
                    scope, send, 422, f"the JSON body is not valid UTF-8 (byte {exc.start})"
                )
                return
        await self.app(scope, _replay(bytes(body), receive), send)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that hands out `body` in one message, then waits on the real one."""
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed() -> Message:
        if pending:
            return pending.pop()
        return await receive()

    return replayed


def _is_json(headers: Headers) -> bool:
    media = headers.get("content-type", "").split(";")[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


def _too_large(limit: int) -> str:
    return f"request body exceeds {limit} bytes"


async def _answer(
    scope: Scope,
    send: Send,
    status_code: int,
    detail: str,
    headers: dict[str, str] | None = None,
    *,
    close: bool = False,
) -> None:
    """A JSON error response; with `close`, the connection ends after it (its request's body
    was not read to the end, so the connection cannot carry another request)."""
    extra = dict(headers or {})
    if close:
        extra["Connection"] = "close"
    response = JSONResponse({"detail": detail}, status_code=status_code, headers=extra)

    async def nothing() -> Message:
        return {"type": "http.disconnect"}

    await response(scope, nothing, send)


async def validation_error_response(request: Request, exc: Exception) -> Response:
    """FastAPI's 422 for invalid requests, with bounded size: a few issues, short excerpts."""
    assert isinstance(exc, RequestValidationError)
    errors: Sequence[Any] = exc.errors()
    shown = [_short_issue(err) for err in errors[:MAX_REPORTED_ERRORS]]
    if len(errors) > MAX_REPORTED_ERRORS:
        more = len(errors) - MAX_REPORTED_ERRORS
        shown.append({"type": "too_many_errors", "loc": [], "msg": f"and {more} more issue(s)"})
    return JSONResponse({"detail": shown}, status_code=422)


def _short_issue(err: Any) -> dict[str, Any]:
    issue: dict[str, Any] = {
        "type": str(err.get("type", "invalid")),
        "loc": [_clip(str(p)) if isinstance(p, str) else p for p in err.get("loc", ())][:8],
        "msg": _clip(str(err.get("msg", "")), 300),
    }
    if "input" in err:
        issue["input"] = _excerpt(err["input"])
    ctx = err.get("ctx")
    if ctx:
        issue["ctx"] = {str(k): _excerpt(v) for k, v in list(ctx.items())[:4]}
    return issue


def _excerpt(value: Any) -> Any:
    """`value` itself when it is a short scalar, else at most EXCERPT_CHARS of its JSON."""
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        return _clip(redact(value))
    try:
        text = json.dumps(jsonable_encoder(value), separators=(",", ":"))
    except (TypeError, ValueError):
        text = repr(value)
    return _clip(redact(text))


def _clip(text: str, limit: int = EXCERPT_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def http_protocol(header_timeout_s: float) -> type[asyncio.Protocol] | str:
    """uvicorn's `http` setting: its httptools protocol with a time limit on request heads.

    Without httptools (uvicorn installed without its `standard` extra) this is "auto", and
    a half-sent head waits until the client gives up; a warning says so.
    """
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        log.warning("httptools is not installed: request heads have no time limit")
        return "auto"

    class HeaderTimeoutProtocol(HttpToolsProtocol):
        """Closes a connection whose request head is incomplete `header_timeout_s` after the
        connection was made or its request began."""

        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(header_timeout_s, self._head_too_slow)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_too_slow(self) -> None:
            self._head_timer = None
            if not self.transport.is_closing():
                self.transport.close()

    return HeaderTimeoutProtocol
