"""API-key checks for HTTP routes and WebSocket handshakes.

When `Settings.api_key` is set, HTTP clients send it as `X-API-Key: <key>` or
`Authorization: Bearer <key>`. Browsers cannot set headers on a WebSocket, so WebSockets may
also pass it as `?api_key=<key>` (visible in access logs) or, preferably, as a subprotocol
`vdet.api-key.<key>` next to `vdet.v1`; the server then selects `vdet.v1` (or the key's own
entry if that was the only one offered, as browsers require one of theirs to be echoed).
Keys are compared in constant time. This module decides who may call; not what they may do.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Annotated

from fastapi import HTTPException, Security, status
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from starlette.requests import Request
from starlette.websockets import WebSocket

from vdet.api.deps import service_of

SUBPROTOCOL = "vdet.v1"
KEY_SUBPROTOCOL_PREFIX = "vdet.api-key."

_api_key_header = APIKeyHeader(
    name="X-API-Key", auto_error=False, description="The server's API key."
)
_bearer = HTTPBearer(auto_error=False, description="The server's API key as a bearer token.")


def _matches(supplied: str | None, expected: str) -> bool:
    return supplied is not None and secrets.compare_digest(
        supplied.encode("utf-8", "replace"), expected.encode("utf-8")
    )


def headers_carry_key(headers: Mapping[str, str], key: str) -> bool:
    """Whether `X-API-Key` or `Authorization: Bearer` in `headers` is `key`.

    For checks made before routing (vdet.api.limits), where FastAPI's security schemes
    have not run yet.
    """
    scheme, _, token = headers.get("authorization", "").partition(" ")
    bearer = token.strip() if scheme.lower() == "bearer" else None
    return _matches(headers.get("x-api-key"), key) or _matches(bearer, key)


def require_api_key(
    request: Request,
    api_key: Annotated[str | None, Security(_api_key_header)],
    bearer: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)],
) -> None:
    """Route dependency: 401 unless the configured API key was sent."""
    expected = service_of(request).settings.api_key
    if expected is None:
        return
    key = expected.get_secret_value()
    if _matches(api_key, key) or _matches(bearer.credentials if bearer else None, key):
        return
    raise HTTPException(
        status.HTTP_401_UNAUTHORIZED,
        detail="missing or invalid API key (send X-API-Key or Authorization: Bearer)",
        headers={"WWW-Authenticate": "Bearer"},
    )


def websocket_auth(ws: WebSocket) -> tuple[bool, str | None]:
    """(authorised, subprotocol to accept with) for a WebSocket handshake."""
    offered: list[str] = list(ws.scope.get("subprotocols") or [])
    chosen = SUBPROTOCOL if SUBPROTOCOL in offered else None
    expected = service_of(ws).settings.api_key
    if expected is None:
        return True, chosen
    key = expected.get_secret_value()
    for proto in offered:
        if proto.startswith(KEY_SUBPROTOCOL_PREFIX) and _matches(
            proto[len(KEY_SUBPROTOCOL_PREFIX) :], key
        ):
            return True, chosen or proto
    ok = headers_carry_key(ws.headers, key) or _matches(ws.query_params.get("api_key"), key)
    return ok, chosen
