"""Fixtures for the browser tests: a work folder, one Chromium profile per module, a page."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.browser import BrowserContext, Page, chromium_context


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("web")


@pytest.fixture(scope="module")
def browser(workdir: Path) -> Iterator[BrowserContext]:
    with chromium_context(workdir / "chromium-profile") as context:
        yield context


@pytest.fixture
def page(browser: BrowserContext) -> Iterator[Page]:
    page = browser.new_page()
    try:
        yield page
    finally:
        page.close()
