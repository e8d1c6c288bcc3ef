"""Running the app under uvicorn so that it ends the way the API documents.

uvicorn, asked to stop, closes every WebSocket (code 1012) before the app's shutdown runs, so
clients never got the `shutdown` message with their resume point; and after a graceful
SIGTERM it re-raises the signal, so the process ended with status 143. `GracefulServer`
first stops listening and gives every WebSocket client its goodbye (the hub ends their
subscriptions; each feed sends `shutdown` with `resume_after` and closes with 1001), waits
up to `GOODBYE_WAIT_S` for them, then lets uvicorn shut down as usual; a SIGTERM it handled
ends the process with status 0. `server_config` is uvicorn's configuration as `vdet serve`
runs it (benchmarks and tests start the same). This module runs the server; what is served is
the app's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import time
from collections.abc import Generator

import uvicorn
from fastapi import FastAPI

from vdet.api.limits import http_protocol
from vdet.api.ws_writes import websocket_protocol
from vdet.config.limits import LimitSettings

log = logging.getLogger(__name__)

GOODBYE_WAIT_S = 3.0


def server_config(
    app: FastAPI,
    host: str = "127.0.0.1",
    port: int = 0,
    log_level: str = "warning",
    limits: LimitSettings | None = None,
) -> uvicorn.Config:
    """uvicorn's settings for vdet's app, as `vdet serve` runs it."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        ws_max_size=1 << 20,
        # Compressing every result for every client ran on the event loop: ten replays
        # stalled /healthz for half a second. Results are small JSON; send them as they are.
        ws_per_message_deflate=False,
        # Frames written once per loop pass (vdet.api.ws_writes), not a system call each.
        ws=websocket_protocol(),
        http=http_protocol(limits if limits is not None else LimitSettings()),
        # Live video responses never end by themselves: give them this long after SIGTERM or
        # Ctrl-C, then cut them, so that shutdown cannot wait forever on a viewer.
        timeout_graceful_shutdown=5,
    )
    access = logging.getLogger("uvicorn.access")  # configured by uvicorn.Config just now
    if not any(isinstance(f, QuietPolls) for f in access.filters):
        access.addFilter(QuietPolls())
    errors = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, ShortErrors) for f in errors.filters):
        errors.addFilter(ShortErrors())
    return config


class ShortErrors(logging.Filter):
    """A start-up that fails in the app (a streams file another service holds, a model that
    does not load) in one line: the exception's own, not uvicorn's traceback of it. With
    --log-level debug the traceback is kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR or logging.getLogger(record.name).isEnabledFor(
            logging.DEBUG
        ):
            return True
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            record.msg, record.args = f"{type(exc).__name__}: {exc}", ()
            record.exc_info = record.exc_text = None
        elif isinstance(record.msg, str) and record.msg.startswith("Traceback (most recent"):
            lines = [line for line in record.msg.strip().splitlines() if line.strip()]
            record.msg, record.args = lines[-1] + " (the traceback: --log-level debug)", ()
        return True


class QuietPolls(logging.Filter):
    """Access lines of successful GET and HEAD requests (the web page's polls, health checks,
    Prometheus scrapes) at DEBUG: shown with `--log-level debug`, left out at info. Changes
    (POST, PATCH, PUT, DELETE) and every error stay at INFO."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if not (isinstance(args, tuple) and len(args) == 5):
            return True  # not uvicorn's access line
        method, status = args[1], args[4]
        if method not in ("GET", "HEAD") or not isinstance(status, int) or status >= 400:
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


class GracefulServer(uvicorn.Server):
    """uvicorn's server with WebSocket goodbyes before its shutdown and exit 0 on SIGTERM."""

    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self._app = app

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:  # no new clients while the current ones are told
            server.close()
        await say_goodbye(self._app)
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        with super().capture_signals():
            try:
                yield
            finally:
                # A SIGTERM was handled: shut down gracefully, which is success. uvicorn would
                # re-raise it once its handlers are restored (status 143). Others, such as
                # SIGINT, are re-raised as before.
                captured: list[int] = getattr(self, "_captured_signals", [])
                captured[:] = [s for s in captured if s != signal.SIGTERM]


async def say_goodbye(app: FastAPI, wait_s: float = GOODBYE_WAIT_S) -> None:
    """End every WebSocket feed of `app` with `shutdown` and wait (up to `wait_s`) for them."""
    service = app.state.service
    service.ready = False  # readiness fails and new feeds are refused from now on
    service.hub.close()
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        clients = service.metrics.registry.get_sample_value("vdet_websocket_clients") or 0
        if clients <= 0:
            return
        await asyncio.sleep(0.02)
    log.warning("WebSocket clients still connected after %.1f s of goodbyes", wait_s)
