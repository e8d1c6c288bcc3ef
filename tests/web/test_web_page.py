"""The operator's page in a real headless Chromium against a real `vdet serve`.

The server runs the demo model on the bundled sample clip (the `demo` stream); the browser
loads `/`, watches the live view (checking canvas pixels: the frame and the boxes drawn on
it), adds a stream through the form, gets a 422 next to the URL field, changes thresholds,
removes a stream, and does all of it again on a server that has an API key, which must
never appear in a URL.
"""

from __future__ import annotations

import colorsys
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.browser import BrowserContext, Page, chromium_context
from support.procs import Process, http_json, wait_http_ok
from support.rtsp import free_port
from support.waiting import wait_until

from vdet.cli import asset_path

pytestmark = pytest.mark.slow

API_KEY = "page-test-key-0123456789"


@dataclass
class Server:
    process: Process
    base_url: str


def _serve(workdir: Path, name: str, **config: Any) -> Iterator[Server]:
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
        wait_http_ok(process, f"{server.base_url}/readyz", timeout=60)
        yield server
    finally:
        process.stop()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("web")


@pytest.fixture(scope="module")
def server(workdir: Path) -> Iterator[Server]:
    yield from _serve(workdir, "open")


@pytest.fixture(scope="module")
def keyed_server(workdir: Path) -> Iterator[Server]:
    yield from _serve(workdir, "keyed", api_key=API_KEY)


@pytest.fixture(scope="module")
def browser(workdir: Path) -> Iterator[BrowserContext]:
    with chromium_context(workdir / "chromium-profile") as context:
        yield context


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


@pytest.fixture
def page(browser: BrowserContext) -> Iterator[Page]:
    page = browser.new_page()
    try:
        yield page
    finally:
        page.close()


def _row(page: Page, stream_id: str) -> Any:
    return page.locator(f'#streams tbody tr[data-stream-id="{stream_id}"]')


def _wait_streaming(page: Page, stream_id: str) -> None:
    _row(page, stream_id).locator(".state-streaming").wait_for(timeout=30_000)


def _class_rgb(class_id: int) -> tuple[int, int, int]:
    # The page's hsl((id * 47 mod 180) * 2, 100%, 55%), the snapshot's colour per class.
    hue = ((class_id * 47) % 180) * 2 / 360
    r, g, b = colorsys.hls_to_rgb(hue, 0.55, 1.0)
    return round(r * 255), round(g * 255), round(b * 255)


_PIXELS_JS = """
() => {
  const canvas = document.querySelector('#live');
  const view = live;
  if (!view || !view.frame || !view.drawn.length) return null;
  const ctx = canvas.getContext('2d');
  const all = ctx.getImageData(0, 0, canvas.width, canvas.height).data;
  let sum = 0, sumSq = 0, n = 0;
  for (let i = 0; i < all.length; i += 4 * 97) {
    const v = all[i + 1]; sum += v; sumSq += v * v; n++;
  }
  const d = view.drawn[0];
  const sx = canvas.width / view.frame.sourceWidth, sy = canvas.height / view.frame.sourceHeight;
  const x = Math.round(d.box[0] * sx);
  const y1 = Math.round(d.box[1] * sy) + 2, y2 = Math.round(d.box[3] * sy) - 2;
  const edge = Array.from(ctx.getImageData(x, y1, 1, Math.max(1, y2 - y1)).data);
  const raw = new OffscreenCanvas(canvas.width, canvas.height).getContext('2d');
  raw.drawImage(view.frame.bitmap, 0, 0);
  const rawEdge = Array.from(raw.getImageData(x, y1, 1, Math.max(1, y2 - y1)).data);
  const std = Math.sqrt(sumSq / n - (sum / n) ** 2);
  return {classId: d.class_id, edge, rawEdge, std};
}
"""


def _share_near(rgba: list[int], rgb: tuple[int, int, int], tolerance: int = 40) -> float:
    pixels = [rgba[i : i + 3] for i in range(0, len(rgba), 4)]
    near = [p for p in pixels if all(abs(c - e) <= tolerance for c, e in zip(p, rgb, strict=True))]
    return len(near) / max(1, len(pixels))


def test_page_loads_without_errors_and_shows_the_demo_stream_with_boxes(
    server: Server, page: Page
) -> None:
    console = Console(page)
    response = page.goto(server.base_url + "/")
    assert response is not None and response.status == 200
    _wait_streaming(page, "demo")
    # The page opens the first stream's live view; frames arrive and boxes are drawn on them.
    page.wait_for_function(
        "() => Number(document.querySelector('#live').dataset.boxes) > 0", timeout=30_000
    )
    page.wait_for_function(
        "() => Number(document.querySelector('#live').dataset.fps) > 0", timeout=30_000
    )
    pixels = wait_until(lambda: page.evaluate(_PIXELS_JS), 10, what="a drawn frame")
    assert pixels["std"] > 10, "the canvas shows no picture"
    colour = _class_rgb(pixels["classId"])
    assert _share_near(pixels["edge"], colour) >= 0.6, "no box edge in the class colour"
    assert _share_near(pixels["rawEdge"], colour) < 0.3, "the frame itself had that colour"
    # Rows carry the live numbers: measured detection fps appears after two polls.
    row = _row(page, "demo")
    wait_until(lambda: row.locator("td").nth(3).inner_text() not in ("", "\u2013"), 10)
    assert console.errors == []


def test_add_change_and_remove_a_stream_through_the_forms(server: Server, page: Page) -> None:
    console = Console(page)
    page.goto(server.base_url + "/")
    _wait_streaming(page, "demo")
    form = page.locator("#add-form")

    # A URL the server refuses: the 422 sentence is shown next to the URL field.
    form.locator('input[name="id"]').fill("bad")
    form.locator('input[name="url"]').fill("ftp://camera.local/stream")
    form.locator('button[type="submit"]').click()
    url_error = form.locator('[data-error-for="url"]')
    url_error.wait_for(timeout=10_000)
    assert "unsupported source scheme" in url_error.inner_text()
    assert form.locator('input[name="url"]').get_attribute("aria-invalid") == "true"
    # A field pydantic refuses: its message lands next to that field too.
    form.locator('input[name="url"]').fill(str(asset_path("sample.mp4")))
    form.locator('input[name="conf_threshold"]').fill("1.5")
    form.locator('button[type="submit"]').click()
    conf_error = form.locator('[data-error-for="conf_threshold"]')
    wait_until(lambda: conf_error.inner_text(), 10, what="the conf_threshold error")
    assert "1" in conf_error.inner_text()

    form.locator('input[name="conf_threshold"]').fill("0.4")
    form.locator('input[name="id"]').fill("added")
    form.locator('input[name="loop"]').check()
    form.locator('button[type="submit"]').click()
    _wait_streaming(page, "added")
    spec = http_json(f"{server.base_url}/v1/streams/added")["spec"]
    assert spec["conf_threshold"] == 0.4 and spec["loop"] is True

    # Thresholds: open its live view, send a bad value (422 by the field), then a good one.
    _row(page, "added").locator("td").first.locator("button").click()
    params = page.locator("#params-form")
    params.locator('input[name="iou_threshold"]').fill("2")
    params.locator('button[type="submit"]').click()
    iou_error = params.locator('[data-error-for="iou_threshold"]')
    wait_until(lambda: iou_error.inner_text(), 10, what="the iou_threshold error")
    params.locator('input[name="iou_threshold"]').fill("0.6")
    params.locator('button[type="submit"]').click()
    wait_until(lambda: params.locator("[data-done]").inner_text() == "applied", 10)
    assert http_json(f"{server.base_url}/v1/streams/added")["effective"]["iou_threshold"] == 0.6

    # Remove: two clicks (the first arms the button).
    remove = _row(page, "added").locator("button.danger")
    remove.click()
    remove.click()
    _row(page, "added").wait_for(state="detached", timeout=10_000)
    ids = [s["id"] for s in http_json(f"{server.base_url}/v1/streams")["streams"]]
    assert ids == ["demo"]
    # 422 responses are reported by Chromium as failed loads; nothing else may be.
    assert [e for e in console.errors if "422" not in e] == []


def test_with_an_api_key_the_page_asks_once_and_never_puts_it_in_a_url(
    keyed_server: Server, page: Page
) -> None:
    console = Console(page)
    page.goto(keyed_server.base_url + "/")
    dialog = page.locator("#key-dialog")
    dialog.wait_for(state="visible", timeout=10_000)
    page.locator("#key-input").fill(API_KEY)
    page.locator("#key-save").click()
    _wait_streaming(page, "demo")
    page.wait_for_function(
        "() => Number(document.querySelector('#live').dataset.boxes) > 0", timeout=30_000
    )
    # A reload keeps the key for this tab: no second prompt.
    page.reload()
    _wait_streaming(page, "demo")
    assert not dialog.is_visible()
    page.wait_for_function(
        "() => Number(document.querySelector('#live').dataset.fps) > 0", timeout=30_000
    )
    assert console.urls and not [u for u in console.urls if API_KEY in u]
    # Before the key was entered, the API's 401s are reported as failed loads.
    assert [e for e in console.errors if "401" not in e] == []
