"""JSON answers that always render: `SafeJSONResponse`, the app's response class, and the error
handlers that answer with it.

Starlette's JSONResponse refuses what strict JSON cannot say: an infinite or NaN float, and text
that is not Unicode (a lone surrogate, which JSON input can spell as "\\ud800"). An error that
echoes such input, a 422 quoting `1e999` say, then fails to render and the client gets a 500 and a
reset connection. Here such values become text ("inf", "nan", "\\\\ud800") instead.
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import FastAPI
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response


class SafeJSONResponse(JSONResponse):
    """JSONResponse that renders any content: values strict JSON refuses become text. The body
    ends with a newline, so that a shell prompt after `curl` starts on a line of its own."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content) + b"\n"
        except (ValueError, UnicodeEncodeError):  # non-finite float, lone surrogate
            return super().render(json_safe(content)) + b"\n"


def json_safe(value: Any) -> Any:
    """`value` with non-finite floats as text and text made Unicode (lone surrogates escaped)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, str):
        return safe_text(value)
    if isinstance(value, dict):
        return {safe_text(str(k)): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def safe_text(text: str) -> str:
    """`text`, its lone surrogates (not Unicode) written as backslash escapes."""
    if text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def install(app: FastAPI) -> None:
    """Answer HTTPExceptions with SafeJSONResponse (FastAPI's own handler cannot render all)."""

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        headers = getattr(exc, "headers", None)
        if exc.status_code in (204, 304) or exc.status_code < 200:
            return Response(status_code=exc.status_code, headers=headers)
        return SafeJSONResponse(
            {"detail": exc.detail}, status_code=exc.status_code, headers=headers
        )

    app.add_exception_handler(HTTPException, http_error)
