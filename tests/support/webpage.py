"""A real `vdet serve` for browser tests, and what a page logged and requested."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from support.browser import Page
from support.procs import Process, wait_http_ok
from support.rtsp import free_port


@dataclass
class Server:
    process: Process
    base_url: str


def serve(workdir: Path, name: str, **config: Any) -> Iterator[Server]:
    """`vdet serve` with `config` (no sources: the demo stream) until the generator closes."""
    port = free_port()
    config_path = workdir / f"{name}.yaml"
    config_path.write_text(yaml.safe_dump({"host": "127.0.0.1", "port": port, **config}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("VDET_")}
    process = Process(
        [str(Path(sys.executable).parent / "vdet"), "serve", "--config", str(config_path)],
        workdir / f"{name}.log",
        env=env,
    )
    server = Server(process, f"http://127.0.0.1:{port}")
    try:
        wait_http_ok(process, f"{server.base_url}/readyz", timeout=120)
        yield server
    finally:
        process.stop()


class Console:
    """Console errors and uncaught exceptions of a page, and every URL it requested."""

    def __init__(self, page: Page) -> None:
        self.errors: list[str] = []
        self.urls: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self.errors.append(f"uncaught: {exc}"))
        page.on("request", lambda request: self.urls.append(request.url))
        page.on("websocket", lambda ws: self.urls.append(ws.url))

    def _console(self, message: Any) -> None:
        if message.type != "error":
            return
        url = str(message.location.get("url", ""))
        # Zones come from an endpoint this server may not have yet; the page asks and draws
        # none on a 404, which Chromium reports as a failed resource load.
        if url.endswith("/zones") and "404" in message.text:
            return
        self.errors.append(f"{message.text} ({url})")


def row(page: Page, stream_id: str) -> Any:
    return page.locator(f'#streams tbody tr[data-stream-id="{stream_id}"]')


def wait_streaming(page: Page, stream_id: str) -> None:
    row(page, stream_id).locator(".state-streaming").wait_for(timeout=60_000)
