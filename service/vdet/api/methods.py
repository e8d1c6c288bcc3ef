"""The methods of a URL, answered per HTTP: `OPTIONS` says them (204 with `Allow`), and a 405
lists all of them in its `Allow`, not only those of the first route that matched the path.

Starlette routes each method of a path separately (`GET /v1/streams` and `POST /v1/streams` are
two routes), so on its own it answers OPTIONS 405 and names one route's methods in `Allow`.
"""

from __future__ import annotations

from starlette.routing import BaseRoute, Match, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class AllowedMethods:
    """ASGI middleware: OPTIONS and 405 answered with every method the path's routes take."""

    def __init__(self, app: ASGIApp, routes: list[BaseRoute]) -> None:
        self.app = app
        self.routes = routes

    def allowed(self, scope: Scope) -> set[str]:
        """The methods the routes matching `scope`'s path take (empty: no route has it)."""
        methods: set[str] = set()
        for route in self.routes:
            if isinstance(route, Route) and route.methods:
                match, _ = route.matches(scope)
                if match != Match.NONE:
                    methods |= route.methods
        return methods | {"OPTIONS"} if methods else methods

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["method"] == "OPTIONS" and (allowed := self.allowed(scope)):
            await send(
                {
                    "type": "http.response.start",
                    "status": 204,
                    "headers": [(b"allow", _allow(allowed))],
                }
            )
            await send({"type": "http.response.body", "body": b""})
            return

        async def send_with_allow(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 405:
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"allow"]
                headers.append((b"allow", _allow(self.allowed(scope))))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_allow)


def _allow(methods: set[str]) -> bytes:
    return ", ".join(sorted(methods)).encode("latin-1")
