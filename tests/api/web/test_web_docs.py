"""/docs in a real Chromium with no network but the server's: every asset comes from vdet
itself, and the page renders every operation of the API."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from support.browser import Page
from support.procs import http_json
from support.webpage import Console, Server, serve

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(workdir: Path) -> Iterator[Server]:
    yield from serve(workdir, "docs")


def offline(page: Page, server: Server) -> list[str]:
    """Refuse every request that does not go to the server, as a closed network would."""
    refused: list[str] = []
    ours = urlsplit(server.base_url).netloc

    def route(route: Any) -> None:
        if urlsplit(route.request.url).netloc == ours:
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort("internetdisconnected")

    page.route("**/*", route)
    return refused


def operations(server: Server) -> int:
    spec = http_json(server.base_url + "/openapi.json")
    return sum(
        1
        for methods in spec["paths"].values()
        for m in methods
        if m in ("get", "post", "patch", "put", "delete")
    )


def test_swagger_ui_renders_every_operation_offline(server: Server, page: Page) -> None:
    refused = offline(page, server)
    console = Console(page)
    response = page.goto(server.base_url + "/docs")
    assert response is not None and response.status == 200
    page.locator(".opblock").first.wait_for(timeout=30_000)
    assert page.locator(".opblock").count() == operations(server)
    assert page.locator(".opblock-summary-path", has_text="/v1/streams/{stream_id}").count() >= 1
    assert refused == [] and console.errors == []
