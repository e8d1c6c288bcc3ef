"""The operator's page on a server with an API key: asked for once, never put in a URL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.browser import Page
from support.webpage import Console, Server, serve, wait_streaming

pytestmark = pytest.mark.slow

API_KEY = "page-test-key-0123456789"


@pytest.fixture(scope="module")
def keyed_server(workdir: Path) -> Iterator[Server]:
    yield from serve(workdir, "keyed", api_key=API_KEY)


def test_with_an_api_key_the_page_asks_once_and_never_puts_it_in_a_url(
    keyed_server: Server, page: Page
) -> None:
    console = Console(page)
    page.goto(keyed_server.base_url + "/")
    dialog = page.locator("#key-dialog")
    dialog.wait_for(state="visible", timeout=10_000)
    page.locator("#key-input").fill(API_KEY)
    page.locator("#key-save").click()
    wait_streaming(page, "demo")
    page.wait_for_function(
        "() => Number(document.querySelector('#live').dataset.boxes) > 0", timeout=30_000
    )
    # A reload keeps the key for this tab: no second prompt.
    page.reload()
    wait_streaming(page, "demo")
    assert not dialog.is_visible()
    page.wait_for_function(
        "() => Number(document.querySelector('#live').dataset.fps) > 0", timeout=30_000
    )
    assert console.urls and not [u for u in console.urls if API_KEY in u]
    # Before the key was entered, the API's 401s are reported as failed loads.
    assert [e for e in console.errors if "401" not in e] == []
