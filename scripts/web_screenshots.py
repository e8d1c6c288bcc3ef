"""Screenshots of the web page for the docs: a real `vdet serve` in headless Chromium.

The server runs the demo stream (with a zone and a counting line, so that counts and the event
history fill in), a second copy of the sample clip and a camera that does not answer (to show
a stream in backoff with its error). Writes docs/images/web-page.jpg (the whole page at
1600 px), docs/images/web-page-420.jpg (at 420 px, a phone) and docs/images/web-live.jpg
(the live view).

    .venv/bin/python scripts/web_screenshots.py
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml
from playwright.sync_api import sync_playwright

from vdet.core.assets import asset_path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from support.browser import CHROMIUM_ARGS  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    out = REPO / "docs" / "images"
    out.mkdir(parents=True, exist_ok=True)
    port, dead = _free_port(), _free_port()
    sample = str(asset_path("sample.mp4"))
    config = {
        "host": "127.0.0.1",
        "port": port,
        "log_level": "warning",
        "sources": [
            {
                "id": "demo",
                "url": sample,
                "loop": True,
                "zones": [
                    {
                        "id": "yard",
                        "kind": "polygon",
                        "points": [[0.05, 0.05], [0.6, 0.05], [0.6, 0.95], [0.05, 0.95]],
                    },
                    {"id": "middle", "kind": "line", "points": [[0.75, 0.0], [0.75, 1.0]]},
                ],
            },
            {"id": "lobby", "url": sample, "loop": True, "conf_threshold": 0.5},
            {"id": "gate", "url": f"rtsp://127.0.0.1:{dead}/stream1"},
        ],
    }
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        config_path = Path(tmp) / "vdet.yaml"
        config_path.write_text(yaml.safe_dump(config))
        env = {k: v for k, v in os.environ.items() if not k.startswith("VDET_")}
        vdet = str(Path(sys.executable).parent / "vdet")
        server = subprocess.Popen([vdet, "serve", "--config", str(config_path)], env=env)
        try:
            for _ in range(120):
                try:
                    with urllib.request.urlopen(base + "/readyz", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    time.sleep(0.5)
            with sync_playwright() as pw:
                context = pw.chromium.launch_persistent_context(
                    str(Path(tmp) / "profile"),
                    executable_path="/usr/bin/chromium",
                    args=CHROMIUM_ARGS,
                    headless=True,
                    viewport={"width": 1600, "height": 1000},
                )
                page = context.new_page()
                page.goto(base + "/")
                page.wait_for_function(
                    "() => Number(document.querySelector('#live').dataset.boxes) > 0"
                )
                time.sleep(15)  # rates, counts, events and the dead camera's error fill in
                page.screenshot(path=str(out / "web-page.jpg"), full_page=True, quality=80)
                page.locator("#live-section").screenshot(path=str(out / "web-live.jpg"), quality=85)
                page.set_viewport_size({"width": 420, "height": 900})
                time.sleep(2)
                page.screenshot(path=str(out / "web-page-420.jpg"), full_page=True, quality=80)
                context.close()
        finally:
            server.terminate()
            server.wait(timeout=30)
    print(f"wrote web-page.jpg, web-page-420.jpg and web-live.jpg in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
