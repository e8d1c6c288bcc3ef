"""What an operator runs a site from, in a real Chromium against a real `vdet serve` (the demo
model on the bundled clip): the camera grid, rates beside totals, the Remove confirmation that
stays visible, the narrow layout, the zone/line/mask editor saving through the zones API and
the events it then produces, the counts, the event history with filters and paging, and the
offline state when the server stops. (The screenshots in docs/images come from
scripts/web_screenshots.py.)"""

from __future__ import annotations

import re
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

DEAD = "rtsp://127.0.0.1:9/nothing"  # refused at once: the stream fails and retries


@pytest.fixture(scope="module")
def server(workdir: Path) -> Iterator[Server]:
    yield from serve(workdir, "operator")


def post_stream(server: Server, body: dict[str, Any]) -> None:
    import json
    import urllib.request

    request = urllib.request.Request(
        f"{server.base_url}/v1/streams",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 201


def delete_stream(server: Server, stream_id: str) -> None:
    import urllib.request

    request = urllib.request.Request(f"{server.base_url}/v1/streams/{stream_id}", method="DELETE")
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 204


def click_at(page: Page, x: float, y: float) -> None:
    """Click the live canvas at (x, y), fractions of its width and height."""
    page.locator("#live").scroll_into_view_if_needed()
    box = page.locator("#live").bounding_box()
    assert box is not None
    page.mouse.click(box["x"] + x * box["width"], box["y"] + y * box["height"])


def test_the_live_view_opens_on_a_stream_that_streams_not_the_first_dead_one(
    server: Server, page: Page
) -> None:
    post_stream(server, {"id": "aaa-dead", "url": DEAD})
    try:
        page.goto(server.base_url + "/")
        wait_streaming(page, "demo")
        page.locator("#live-section").wait_for(timeout=30_000)
        assert page.locator("#live-id").inner_text() == "demo"
        # The grid: a tile per stream; the live stream's tile says so; its neighbour has a frame.
        tiles = page.locator("#grid .tile")
        wait_until(lambda: tiles.count() == 2, 10, what="two tiles")
        demo_tile = page.locator('#grid .tile[data-stream-id="demo"]')
        assert "live below" in demo_tile.inner_text()
        dead = page.locator('#grid .tile[data-stream-id="aaa-dead"]')
        assert dead.get_attribute("data-state") in ("connecting", "backoff", "failed")
        assert page.locator("#conn").inner_text() == ""  # connected: nothing to say
    finally:
        delete_stream(server, "aaa-dead")


def test_rates_beside_totals_and_a_remove_confirmation_that_stays(
    server: Server, page: Page
) -> None:
    post_stream(
        server,
        {"id": "spare", "url": str(asset_path("sample.mp4")), "loop": True, "detect_fps": 5},
    )
    page.goto(server.base_url + "/")
    wait_streaming(page, "spare")
    headers = [h.inner_text() for h in page.locator("#streams thead th").all()]
    skipped = row(page, "spare").locator("td").nth(headers.index("skipped"))
    wait_until(
        lambda: re.fullmatch(r"(\d+\.\d)/s \((\d+)\)", skipped.inner_text()), 15, what="a rate"
    )
    rate = float(skipped.inner_text().split("/")[0])
    assert 10 <= rate <= 40, skipped.inner_text()  # about 30 fps read, 5 detected
    # A tile of its own, with a frame; clicking it opens its live view.
    tile = page.locator('#grid .tile[data-stream-id="spare"]')
    wait_until(
        lambda: tile.locator("img").evaluate("img => img.naturalWidth") > 0, 15, what="a tile"
    )
    tile.click()
    wait_until(lambda: page.locator("#live-id").inner_text() == "spare", 10)

    remove = row(page, "spare").locator("button.danger")
    remove.click()
    page.wait_for_timeout(2500)  # two table refreshes
    assert remove.inner_text() == "Click again to remove"
    assert "armed" in (remove.get_attribute("class") or "")
    wait_until(lambda: remove.inner_text() == "Remove", 5, what="the confirmation to expire")
    remove.click()
    # A poll of the list answered before the removal and arriving after it must not bring
    # the row back: hold one answer (fetched now, with the row) on its way, remove, then let
    # it through.
    held: list[Any] = []

    def hold(route: Any) -> None:
        if route.request.method == "GET" and not held:
            held.append((route, route.fetch()))
        else:
            route.continue_()

    page.route("**/v1/streams", hold)
    for _ in range(30):  # the list is polled every second
        if held:
            break
        page.wait_for_timeout(100)
    assert held, "the stream list was not polled"
    remove.click()
    row(page, "spare").wait_for(state="detached", timeout=10_000)
    late, answer = held[0]
    assert "spare" in answer.text()
    with page.expect_response(lambda r: r.request == late.request):
        late.fulfill(response=answer)
    page.unroute("**/v1/streams")
    page.wait_for_timeout(300)  # the late answer reaches the page's handler
    assert row(page, "spare").count() == 0


def test_the_narrow_layout_fits_420_px(server: Server, page: Page) -> None:
    post_stream(server, {"id": "broken-camera", "url": DEAD})
    try:
        page.set_viewport_size({"width": 420, "height": 900})
        page.goto(server.base_url + "/")
        wait_streaming(page, "demo")
        error = row(page, "broken-camera").locator("td.err")
        wait_until(lambda: error.inner_text().strip(), 20, what="the camera's error")
        overflow = page.evaluate(
            "() => document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        assert overflow <= 0
        box = error.bounding_box()
        assert box is not None and box["width"] >= 200  # not one character per line
        page.locator("#live-section").wait_for(timeout=30_000)
        page.wait_for_function(
            "() => Number(document.querySelector('#live').dataset.boxes) > 0", timeout=30_000
        )
    finally:
        delete_stream(server, "broken-camera")


def test_the_editor_saves_a_zone_a_line_and_a_mask_that_then_work(
    server: Server, page: Page
) -> None:
    console = Console(page)
    page.set_viewport_size({"width": 1600, "height": 1000})
    page.goto(server.base_url + "/")
    wait_streaming(page, "demo")
    page.wait_for_function(
        "() => Number(document.querySelector('#live').dataset.boxes) > 0", timeout=30_000
    )
    editor = page.locator("#editor")

    def draw(kind: str, zone_id: str, points: list[tuple[float, float]]) -> None:
        editor.locator("#zone-kind").select_option(kind)
        editor.locator("#zone-id").fill(zone_id)
        editor.locator("#zone-draw").click()
        for x, y in points:
            click_at(page, x, y)
        editor.locator("#zone-save").click()

    # A bad id: the API's error is shown and nothing is saved.
    draw("polygon", "no spaces please", [(0.1, 0.1), (0.5, 0.1), (0.5, 0.5)])
    wait_until(lambda: editor.locator("#zone-error").inner_text(), 10, what="the error")
    assert http_json(f"{server.base_url}/v1/streams/demo/zones")["zones"] == []
    editor.locator("#zone-cancel").click()

    draw("polygon", "yard", [(0.01, 0.01), (0.99, 0.01), (0.99, 0.99), (0.01, 0.99)])
    wait_until(lambda: editor.locator("#zone-done").inner_text() == "saved yard", 10)
    draw("line", "middle", [(0.5, 0.01), (0.5, 0.99)])
    wait_until(lambda: editor.locator("#zone-done").inner_text() == "saved middle", 10)
    zones = {z["id"]: z for z in http_json(f"{server.base_url}/v1/streams/demo/zones")["zones"]}
    assert zones["yard"]["kind"] == "polygon" and zones["yard"]["normalized"] is True
    assert len(zones["yard"]["points"]) == 4 and zones["middle"]["kind"] == "line"
    assert abs(zones["middle"]["points"][0][0] - 0.5) < 0.01

    # The zone's counts by class in its row; the line's crossings; both as events in the history.
    yard_row = page.locator('#zones tbody tr[data-zone-id="yard"]')
    wait_until(lambda: re.search(r"[a-z_]+ \d", yard_row.inner_text()), 15, what="yard counts")
    history = page.locator("#history tbody")
    wait_until(lambda: "zone_enter" in history.inner_text(), 15, what="zone_enter in the history")
    middle_row = page.locator('#zones tbody tr[data-zone-id="middle"]')
    # A crossing counted (a count of 0 is shown before the first).
    wait_until(
        lambda: re.search(r"(in|out): [a-z_]+ [1-9]", middle_row.inner_text()),
        40,
        what="a crossing",
    )
    page.locator("#history-form select[name=type]").select_option("line_cross")
    page.locator("#history-form button[type=submit]").click()

    def types() -> set[str]:
        """The event types of the rows shown, read at once in the page (rows read one by one
        could be replaced by the next page while being read)."""
        script = (
            "() => [...document.querySelectorAll('#history tbody tr')]"
            ".map(r => r.cells[2].textContent.trim().split(' ')[0])"
        )
        return set(page.evaluate(script))

    # The filtered page replaces the rows shown before it (which hold line_cross too).
    wait_until(
        lambda: types() == {"line_cross"}, 20, interval=0.2, what="only line_cross in the history"
    )

    # A mask over the whole frame: the detections inside are dropped.
    draw("mask", "all", [(0.003, 0.003), (0.997, 0.003), (0.997, 0.997), (0.003, 0.997)])
    wait_until(lambda: editor.locator("#zone-done").inner_text() == "saved all", 10)
    page.wait_for_function(
        "() => Number(document.querySelector('#live').dataset.boxes) === 0", timeout=30_000
    )
    for zone_id in ("all", "middle", "yard"):
        page.locator(f'#zones tbody tr[data-zone-id="{zone_id}"] button').click()
        page.locator(f'#zones tbody tr[data-zone-id="{zone_id}"]').wait_for(state="detached")
    assert [e for e in console.errors if "422" not in e] == []


def test_history_pages_and_filters(server: Server, page: Page) -> None:
    zone = {"id": "yard", "kind": "polygon", "points": [[0, 0], [1, 0], [1, 1], [0, 1]]}
    post_stream(
        server,
        {"id": "busy", "url": str(asset_path("sample.mp4")), "loop": True, "zones": [zone]},
    )
    try:
        wait_until(
            lambda: (
                http_json(f"{server.base_url}/v1/events/history?stream=busy&limit=500")[
                    "next_before_id"
                ]
                is not None
                or len(
                    http_json(f"{server.base_url}/v1/events/history?stream=busy&limit=500")[
                        "events"
                    ]
                )
                > 60
            ),
            60,
            what="more than two pages of events",
        )
        page.goto(server.base_url + "/")
        form = page.locator("#history-form")
        wait_until(lambda: "busy" in form.locator("select[name=stream]").inner_text(), 10)
        form.locator("select[name=stream]").select_option("busy")
        form.locator("button[type=submit]").click()
        rows = page.locator("#history tbody tr")

        def shown() -> list[tuple[int, str]]:
            """The rows' event ids and streams, read at once in the page (the newest page is
            polled and redrawn while new events come)."""
            script = (
                "() => [...document.querySelectorAll('#history tbody tr')]"
                ".map(r => [Number(r.dataset.eventId), r.cells[1].textContent.trim()])"
            )
            return [(int(i), s) for i, s in page.evaluate(script)]

        wait_until(lambda: len(shown()) == 25, 10, what="a full first page")
        assert {s for _, s in shown()} == {"busy"}
        # The newest page's next poll is answered, and the answer held on its way until page
        # 2 is drawn, then let through: it must not be drawn over page 2.
        held: list[Any] = []

        def hold(route: Any) -> None:
            if "before_id=" in route.request.url or held:
                route.continue_()
            else:
                held.append((route, route.fetch()))

        page.route("**/v1/events/history?*", hold)
        for _ in range(100):  # the poll comes within 5 s (the page's handlers run while waiting)
            if held:
                break
            page.wait_for_timeout(100)
        assert held, "the newest page was not polled"
        # The page asks for the events before the cursor its newest page gave.
        with page.expect_request(lambda r: "before_id=" in r.url) as asked:
            page.locator("#history-older").click()
        cursor = re.search(r"before_id=(\d+)", asked.value.url)
        assert cursor is not None
        before_id = int(cursor.group(1))
        note = page.locator("#history-note")
        wait_until(lambda: "page 2" in note.inner_text(), 10, what="page 2")
        late, answer = held[0]
        with page.expect_response(lambda r: r.request == late.request):
            late.fulfill(response=answer)
        page.unroute("**/v1/events/history?*")
        page.wait_for_timeout(500)  # the late answer reaches the page's handler
        second = [i for i, _ in shown()]
        assert "page 2" in note.inner_text()
        assert second and max(second) < before_id
        assert second == sorted(second, reverse=True)
        expected = http_json(
            f"{server.base_url}/v1/events/history?stream=busy&limit=25&before_id={before_id}"
        )
        assert second == [e["id"] for e in expected["events"]]
        # A snapshot of an event, fetched on demand (or said to be gone).
        rows.first.locator("td[data-label=snapshot] button").click()
        wait_until(
            lambda: (
                rows.first.locator("img.thumb").count() == 1
                or "no longer kept" in rows.first.inner_text()
            ),
            10,
        )
        page.locator("#history-newest").click()
        wait_until(lambda: "page 1" in page.locator("#history-note").inner_text(), 10)
    finally:
        delete_stream(server, "busy")


def test_a_stopped_server_shows_offline_not_streaming(workdir: Path, page: Page) -> None:
    servers = serve(workdir, "stopping")
    server = next(servers)
    try:
        page.goto(server.base_url + "/")
        wait_streaming(page, "demo")
        page.locator("#live-section").wait_for(timeout=30_000)
    finally:
        servers.close()  # the server process stops
    page.locator("#offline").wait_for(timeout=10_000)
    assert "unreachable since" in page.locator("#offline").inner_text()
    assert page.locator(".state-streaming").count() == 0
    assert "was streaming" in row(page, "demo").inner_text()
    assert page.locator("body.offline").count() == 1
    assert page.locator("#conn").inner_text() == "offline"


def test_an_event_s_clip_plays_and_seeks_in_the_page(workdir: Path, page: Page) -> None:
    zone = {"id": "yard", "kind": "polygon", "points": [[0, 0], [1, 0], [1, 1], [0, 1]]}
    source = {"id": "demo", "url": str(asset_path("sample.mp4")), "loop": True, "zones": [zone]}
    servers = serve(
        workdir,
        "clips",
        sources=[source],
        clips={
            "folder": str(workdir / "clips"),
            "pre_roll_s": 2.0,
            "post_roll_s": 2.0,
            "max_clip_s": 6.0,
        },
    )
    server = next(servers)
    try:
        clips = wait_until(
            lambda: http_json(f"{server.base_url}/v1/streams/demo/clips")["clips"],
            60,
            what="a clip",
        )
        page.goto(server.base_url + "/")
        history = page.locator("#history tbody tr")
        wait_until(lambda: history.count() > 0, 15, what="events in the history")
        clip = clips[0]

        # The first page follows new events; older pages stay put: page back (as an operator
        # looking for an earlier event would) to a row the clip holds, then play it. Rows are
        # read at once in the page and found again by their event (the newest page is
        # redrawn by its poll).
        script = (
            "() => [...document.querySelectorAll('#history tbody tr')]"
            ".map(r => [r.dataset.eventId, Number(r.dataset.time)])"
        )
        covered = None
        for _ in range(40):
            older = page.locator("#history-older")
            if older.is_enabled():
                older.click()
                page.wait_for_timeout(300)
            start, end = clip["start_time"], clip["end_time"]
            event_id = next((i for i, t in page.evaluate(script) if start <= t <= end), None)
            if event_id is not None:
                covered = page.locator(f'#history tbody tr[data-event-id="{event_id}"]')
            if covered is not None or not older.is_enabled():
                break
        assert covered is not None, "no event of the clip in the history"
        covered.locator("td[data-label=clip] button").click()
        page.locator("#clip-dialog[open]").wait_for(timeout=10_000)
        video = page.locator("#clip-video")
        page.wait_for_function(
            "() => { const v = document.querySelector('#clip-video');"
            " return v.readyState >= 2 && v.duration > 1; }",
            timeout=20_000,
        )
        duration = video.evaluate("v => v.duration")
        assert abs(duration - clip["duration_s"]) <= 0.1
        # Seeking to the middle: served in ranges (the element asks with Range headers).
        video.evaluate("v => { v.pause(); v.currentTime = v.duration / 2; }")
        page.wait_for_function(
            "() => { const v = document.querySelector('#clip-video');"
            " return !v.seeking && Math.abs(v.currentTime - v.duration / 2) < 0.5; }",
            timeout=10_000,
        )
        assert video.evaluate("v => v.error") is None
    finally:
        servers.close()
