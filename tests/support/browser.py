"""A real headless Chromium (Debian's package) driven by Playwright, with no browser download.

Playwright's own browser builds are never fetched: it drives /usr/bin/chromium from the
`chromium` Debian package (.ci/system-packages.txt). The flags keep Chromium from phoning home
(background networking, component updates, sync): without them it tries outbound connections
that a sandboxed CI host refuses, which slows every launch down.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from support.tools import require_tool

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")

try:
    from playwright.sync_api import BrowserContext, Page, sync_playwright
except ImportError:  # pragma: no cover - the dev extra installs it
    sync_playwright = None

__all__ = ["CHROMIUM_ARGS", "BrowserContext", "Page", "chromium_context"]


@contextmanager
def chromium_context(user_data_dir: Path) -> Iterator[BrowserContext]:
    """A fresh Chromium profile in `user_data_dir`, headless, 1280x900."""
    exe = require_tool("chromium", provided_by="Debian package chromium")
    if sync_playwright is None:
        pytest.fail("playwright is not installed (pip install -e '.[dev]')")
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(user_data_dir),
            executable_path=exe,
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": 1280, "height": 900},
        )
        try:
            yield context
        finally:
            context.close()
