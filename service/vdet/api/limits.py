"""What one HTTP request may cost: checks made before routing, reading or parsing it.

`RequestGuard`, an ASGI middleware in front of every route, answers in this order and reads
no byte of a body before the checks that can refuse it without one:

1. the API key (when one is set) on every path but the open ones (`OPEN_PATHS`,
   `OPEN_PREFIXES`): 401;
2. `POST /v1/detect` beyond `limits.max_concurrent_detect` requests at once: 503 with
   `Retry-After`, counted from the request head to the response;
3. a declared `Content-Length` over the route's body limit (`max_upload_bytes` for
   /v1/detect, else `limits.max_json_body_bytes`): 413;
4. the body itself, read here: counted (413 at the limit, never buffered beyond it), due
   whole within `limits.body_timeout_s` of the request head and never silent for
   `limits.body_stall_timeout_s` (408, connection closed: a stalled upload frees its slot);
   a JSON body must be UTF-8 (422). The app then gets the body in one piece.

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
import math
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vdet.api.auth import headers_carry_key
from vdet.api.responses import SafeJSONResponse, safe_text
from vdet.config.limits import LimitSettings
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
        "/openapi.json",
    }
)
OPEN_PREFIXES = ("/ui/", "/docs-assets/")  # the web page's and /docs' files
MAX_REPORTED_ERRORS = 20
EXCERPT_CHARS = 80


def install(app: FastAPI, settings: Settings) -> None:
    """Put the request guard in front of `app`'s routes, bound its 422 answers and say in the
    OpenAPI document what the guard may answer."""
    app.add_middleware(RequestGuard, settings=settings)
    app.add_exception_handler(RequestValidationError, validation_error_response)
    _document(app)


_ERROR = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorOut"}}}
_HEAD_TOO_LARGE = {
    "description": "Request head over limits.max_head_bytes or limits.max_header_count "
    "(the connection is closed).",
    "content": _ERROR,
}
_BODY_ANSWERS = {
    "408": {
        "description": "The body stalled (limits.body_stall_timeout_s) or did not arrive "
        "within limits.body_timeout_s (the connection is closed).",
        "content": _ERROR,
    },
    "413": {
        "description": "Body over its limit (limits.max_json_body_bytes; max_upload_bytes "
        "for /v1/detect).",
        "content": _ERROR,
    },
}


def _document(app: FastAPI) -> None:
    """Add the guard's answers to every operation of `app.openapi()`: 431 on all, 408 and 413
    on those with a body."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = generate()
        for item in schema.get("paths", {}).values():
            for operation in item.values():
                answers = operation.setdefault("responses", {})
                answers.setdefault("431", _HEAD_TOO_LARGE)
                if "requestBody" in operation:
                    for code, answer in _BODY_ANSWERS.items():
                        answers.setdefault(code, answer)
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


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
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.body_timeout_s
        try:
            async with asyncio.timeout(None) as timeout:
                while True:
                    timeout.reschedule(
                        min(deadline, loop.time() + self.limits.body_stall_timeout_s)
                    )
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
            if loop.time() >= deadline:
                why = (
                    f"the request body did not arrive within {self.limits.body_timeout_s:g} s "
                    "(limits.body_timeout_s)"
                )
            else:
                why = (
                    f"the request body stalled: no byte for {self.limits.body_stall_timeout_s:g}"
                    " s (limits.body_stall_timeout_s)"
                )
            await _answer(scope, send, 408, why, close=True)
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
    response = SafeJSONResponse({"detail": detail}, status_code=status_code, headers=extra)

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
    return SafeJSONResponse({"detail": shown}, status_code=422)


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
        issue["ctx"] = {_clip(str(k)): _excerpt(v) for k, v in list(ctx.items())[:4]}
    return issue


def _excerpt(value: Any) -> Any:
    """`value` itself when it is a short finite scalar, else at most EXCERPT_CHARS of its JSON
    (or of its repr, for what has none: an infinite float, an exception)."""
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, str):
        return _clip(redact(value))
    try:
        text = json.dumps(jsonable_encoder(value), separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        text = repr(value)
    return _clip(redact(text))


def _clip(text: str, limit: int = EXCERPT_CHARS) -> str:
    """`text`, Unicode (lone surrogates escaped), cut to `limit` characters."""
    text = safe_text(text)
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def http_protocol(limits: LimitSettings) -> type[asyncio.Protocol] | str:
    """uvicorn's `http` setting: its httptools protocol with request heads bounded in time
    (`limits.header_timeout_s`), size (`limits.max_head_bytes`) and header lines
    (`limits.max_header_count`).

    A head over a bound is answered 431 and its connection closed while it is being read: the
    app never sees it, so neither routing nor the API key check runs, and what it costs is at
    most the bound plus one socket read. Without httptools (uvicorn installed without its
    `standard` extra) this is "auto", with no such bounds; a warning says so.
    """
    try:
        import httptools
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        log.warning("httptools is not installed: request heads are not bounded")
        return "auto"
    header_timeout_s = limits.header_timeout_s
    max_head_bytes, max_headers = limits.max_head_bytes, limits.max_header_count

    class HeadTooLargeError(httptools.HttpParserError):
        """Raised in a parser callback: ends the parse, and the 400 becomes a 431."""

    class BoundedHeadProtocol(HttpToolsProtocol):
        """Closes a connection whose request head is incomplete `header_timeout_s` after the
        connection was made or its request began; answers 431 to a head over its size or
        header count."""

        _head_timer: asyncio.TimerHandle | None = None
        _in_head = True  # from the connection (or a request's first byte) to its last header
        _head_bytes = 0  # received since the head began
        _header_lines = 0
        _head_size = 0  # of the request line and the header lines parsed so far
        _refused = False

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return  # what follows a refused head is never parsed
            if self._in_head:
                # Counted before parsing: a header still incomplete is buffered by the parser,
                # so a head that never ends must be cut here, not in a callback.
                if self._head_bytes > max_head_bytes:
                    self._refuse_head()
                    return
                self._head_bytes += len(data)
            super().data_received(data)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._in_head, self._head_bytes, self._header_lines, self._head_size = True, 0, 0, 0
            self._arm()

        def on_url(self, url: bytes) -> None:
            self._head_size += len(url)
            if self._head_size > max_head_bytes:
                raise HeadTooLargeError("request line too long")
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._header_lines += 1
            self._head_size += len(name) + len(value) + 4
            if self._header_lines > max_headers or self._head_size > max_head_bytes:
                raise HeadTooLargeError("request head too large")
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._in_head = False
            self._disarm()
            super().on_headers_complete()

        def send_400_response(self, msg: str) -> None:
            if self._head_over_bounds():
                self._refuse_head()
            else:
                super().send_400_response(msg)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _head_over_bounds(self) -> bool:
            return (
                self._head_bytes > max_head_bytes
                or self._header_lines > max_headers
                or self._head_size > max_head_bytes
            )

        def _refuse_head(self) -> None:
            self._refused = True
            self._disarm()
            if self.transport.is_closing():
                return
            text = (
                f"request head over {max_head_bytes} bytes or {max_headers} header lines "
                "(limits.max_head_bytes, limits.max_header_count)"
            )
            self.transport.write(
                b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
                b"content-type: application/json\r\n"
                + f"content-length: {len(text) + 14}\r\n".encode()
                + b"connection: close\r\n\r\n"
                + f'{{"detail": "{text}"}}'.encode()
            )
            self.transport.close()

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

    return BoundedHeadProtocol
