"""The operator's page in a real headless Chromium against a real `vdet serve`.

The server runs the demo model on the bundled sample clip (the `demo` stream); the browser
loads `/`, watches the live view (checking canvas pixels: the frame and the boxes drawn on
it), adds a stream through the form, gets a 422 next to the URL field, changes thresholds and
removes a stream. With an API key: test_web_api_key.py.
"""

from __future__ import annotations

import colorsys
import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.browser import Page
from support.procs import http_json
from support.waiting import wait_until
from support.webpage import Console, Server, row, serve, wait_streaming

from vdet.core.assets import asset_path

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(workdir: Path) -> Iterator[Server]:
    yield from serve(workdir, "open")


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
  // The stroke (2 px or wider) is centred on the box's left edge, which is rarely on a pixel
  // boundary: only the column at floor(x) is covered whole; its neighbours are blended.
  const x = Math.floor(d.box[0] * sx);
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
    wait_streaming(page, "demo")
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
    # Frames wait for their detections: the boxes drawn are of the frame shown or one before
    # it, never of a later one, and the wait is bounded.
    shown = page.evaluate("({...document.querySelector('#live').dataset})")
    assert int(shown["older"]) >= 0 and 0 <= int(shown["delay"]) <= 1500, shown
    # The first load: the page and its files (not the API's data, not the video).
    transferred = page.evaluate(
        """() => [...performance.getEntriesByType('navigation'),
                  ...performance.getEntriesByType('resource')]
                 .filter(e => e.entryType === 'navigation' || e.name.includes('/ui/'))
                 .reduce((n, e) => n + e.transferSize, 0)"""
    )
    assert 0 < transferred < 200_000
    # Rows carry the live numbers: measured detection fps appears after two polls.
    demo = row(page, "demo")
    wait_until(lambda: demo.locator("td").nth(3).inner_text() not in ("", "\u2013"), 10)
    assert console.errors == []


def test_add_change_and_remove_a_stream_through_the_forms(server: Server, page: Page) -> None:
    console = Console(page)
    page.goto(server.base_url + "/")
    wait_streaming(page, "demo")
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
    form.locator('input[name="detect_fps"]').fill("10")
    form.locator('input[name="id"]').fill("added")
    form.locator('input[name="loop"]').check()
    form.locator('button[type="submit"]').click()
    wait_streaming(page, "added")
    spec = http_json(f"{server.base_url}/v1/streams/added")["spec"]
    assert spec["conf_threshold"] == 0.4 and spec["loop"] is True and spec["detect_fps"] == 10
    # The frames detect_fps leaves out show in the stream's row, apart from the dropped.
    headers = [h.inner_text() for h in page.locator("#streams thead th").all()]
    skipped_cell = row(page, "added").locator("td").nth(headers.index("skipped"))
    # "<per second>/s (<total>)": the rate over the last poll, then the total since the start.
    wait_until(
        lambda: (
            re.fullmatch(r"\d+\.\d/s \((\d+)\)", skipped_cell.inner_text())
            and int(skipped_cell.inner_text().split("(")[1][:-1]) > 0
        ),
        15,
        what="skipped frames shown",
    )

    # Thresholds: open its live view, send a bad value (422 by the field), then a good one.
    row(page, "added").locator("td").first.locator("button").click()
    params = page.locator("#params-form")
    params.locator('input[name="iou_threshold"]').fill("2")
    params.locator('button[type="submit"]').click()
    iou_error = params.locator('[data-error-for="iou_threshold"]')
    wait_until(lambda: iou_error.inner_text(), 10, what="the iou_threshold error")
    assert params.locator('input[name="detect_fps"]').input_value() == "10"
    params.locator('input[name="iou_threshold"]').fill("0.6")
    params.locator('input[name="detect_fps"]').fill("")  # empty: every frame again
    params.locator('button[type="submit"]').click()
    wait_until(lambda: params.locator("[data-done]").inner_text() == "applied", 10)
    added = http_json(f"{server.base_url}/v1/streams/added")
    assert added["effective"]["iou_threshold"] == 0.6 and added["spec"]["detect_fps"] is None

    # Remove: two clicks (the first arms the button).
    remove = row(page, "added").locator("button.danger")
    remove.click()
    remove.click()
    row(page, "added").wait_for(state="detached", timeout=10_000)
    ids = [s["id"] for s in http_json(f"{server.base_url}/v1/streams")["streams"]]
    assert ids == ["demo"]
    # 422 responses are reported by Chromium as failed loads; so is a 404 for the added
    # stream's tile (polled before its first frame, or in flight as it is removed); nothing
    # else may be.
    tile_404 = "404 (Not Found) (http://127.0.0.1"
    unexpected = [
        e
        for e in console.errors
        if "422" not in e and not (tile_404 in e and "/v1/streams/added/snapshot.jpg" in e)
    ]
    assert unexpected == []


_ZONES = {
    "zones": [
        # A stand-in for the zones endpoint (not on this server yet): the contract's shape.
        {
            "id": "door",
            "kind": "polygon",
            "normalized": True,
            "points": [[0.05, 0.05], [0.45, 0.05], [0.45, 0.45], [0.05, 0.45]],
        },
        {"id": "gate", "kind": "line", "normalized": False, "points": [[0, 1000], [1900, 1000]]},
        {
            "id": "poster",
            "kind": "mask",
            "normalized": True,
            "points": [[0.55, 0.05], [0.95, 0.05], [0.95, 0.45], [0.55, 0.45]],
        },
    ]
}

_ZONE_PIXELS_JS = """
(left) => {
  const canvas = document.querySelector('#live');
  if (!live || !live.frame || !live.zones.length) return null;
  const ctx = canvas.getContext('2d');
  const raw = new OffscreenCanvas(canvas.width, canvas.height).getContext('2d');
  raw.drawImage(live.frame.bitmap, 0, 0);
  // A 5x5 grid inside the zone whose left edge is at `left`, away from its edges.
  const pairs = [];
  for (let i = 1; i <= 5; i++) for (let j = 1; j <= 5; j++) {
    const x = Math.round(canvas.width * (left + 0.4 * i / 6));
    const y = Math.round(canvas.height * (0.05 + 0.4 * j / 6));
    pairs.push([Array.from(ctx.getImageData(x, y, 1, 1).data).slice(0, 3),
                Array.from(raw.getImageData(x, y, 1, 1).data).slice(0, 3)]);
  }
  return pairs;
}
"""


def test_zones_are_drawn_when_the_server_has_them(server: Server, page: Page) -> None:
    page.route(
        "**/v1/streams/demo/zones",
        lambda route: route.fulfill(json=_ZONES),
    )
    page.goto(server.base_url + "/")
    pairs = wait_until(lambda: page.evaluate(_ZONE_PIXELS_JS, 0.05), 30, what="zones drawn")

    def lightened(drawn: list[int], raw: list[int]) -> bool:
        # 12% white over the frame.
        return all(abs(d - (0.88 * r + 0.12 * 255)) <= 4 for d, r in zip(drawn, raw, strict=True))

    def shaded(drawn: list[int], raw: list[int]) -> bool:
        # 45% black over the frame: the mask.
        return all(abs(d - 0.55 * r) <= 4 for d, r in zip(drawn, raw, strict=True))

    # The boxes and labels of the frame's detections are drawn over the zone and can cover a
    # row of these points (6 of 25 once, on a loaded machine); a zone not drawn lightens none.
    assert sum(lightened(d, r) for d, r in pairs) >= 0.6 * len(pairs)
    masked = page.evaluate(_ZONE_PIXELS_JS, 0.55)
    assert sum(shaded(d, r) for d, r in masked) >= 0.6 * len(masked)
    assert not any(lightened(d, r) for d, r in masked if max(r) > 40)


def test_track_ids_are_drawn_when_results_carry_them(server: Server, page: Page) -> None:
    # Stand-in for the tracker (not on this server yet): the real feed passes through a
    # WebSocket route that gives every detection a track id, as the tracking contract will.
    def with_track_ids(ws: Any) -> None:
        upstream = ws.connect_to_server()

        def relay(message: str | bytes) -> None:
            event = json.loads(message)
            if event.get("type") == "result":
                for i, detection in enumerate(event["result"]["detections"]):
                    detection["track_id"] = 100 + i
            ws.send(json.dumps(event))

        upstream.on_message(relay)

    page.route_web_socket("**/v1/streams/demo/events*", with_track_ids)
    page.goto(server.base_url + "/")
    labels = wait_until(
        lambda: page.evaluate("() => live && live.labels.length ? live.labels : null"),
        30,
        what="labels drawn",
    )
    assert labels[0].endswith(" #100")
    assert all(" #" in label for label in labels)


_SHOTS_JS = """
() => Array.from(document.querySelectorAll('#shots figure')).map((f) => ({
  loaded: f.querySelector('img').complete && f.querySelector('img').naturalWidth,
  caption: f.querySelector('figcaption').textContent,
}))
"""


def test_event_snapshots_of_the_stream_are_shown_under_the_live_view(
    server: Server, page: Page
) -> None:
    """A zone over the whole frame, put on the demo stream over the API: its tracks' entries
    are kept as event snapshots, which the page fetches (with the key, as any request) and
    shows with what happened."""
    zone = {"kind": "polygon", "points": [[0, 0], [1, 0], [1, 1], [0, 1]]}
    url = f"{server.base_url}/v1/streams/demo/zones/everything"
    put = urllib.request.Request(
        url,
        data=json.dumps(zone).encode(),
        method="PUT",
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(put, timeout=10) as response:
        assert response.status in (200, 201)
    try:
        console = Console(page)
        page.goto(server.base_url + "/")
        shots = wait_until(
            lambda: [s for s in page.evaluate(_SHOTS_JS) if s["loaded"]], 60, what="a snapshot"
        )
        assert any("zone_enter everything" in s["caption"] for s in shots), shots
        assert page.evaluate("document.querySelector('#shots-empty').hidden") is True
        assert not console.errors, console.errors
    finally:
        delete = urllib.request.Request(url, method="DELETE")
        with urllib.request.urlopen(delete, timeout=10) as response:
            assert response.status == 204
