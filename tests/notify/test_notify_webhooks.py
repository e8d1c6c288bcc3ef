"""Webhooks: zone and line events POSTed to a real HTTP server (the standard library's, on a
loopback port), from the real results hub: bodies, filters, signatures, retries, the bounded
queue, shutdown, a reader that falls behind, and the app end to end."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import re
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from support.apptest import CLIP_WH, MakeSettings, TestClient, stream_body
from support.results import NAMES, result
from support.tls import self_signed_ca
from support.tools import REPO
from support.waiting import wait_until
from support.webhooks import Receiver

from vdet.api.app import create_app
from vdet.config.notify import NotifySettings, WebhookSettings
from vdet.config.settings import Settings
from vdet.core.types import DetectionResult, ZoneEvent
from vdet.metrics.registry import Metrics
from vdet.notify.filters import EventFilter
from vdet.notify.notifier import Notifier
from vdet.notify.webhooks import SIGNATURE_HEADER, signature
from vdet.results.hub import EncodedResult, ResultsHub
from vdet.results.wire import encode_result_tail, result_with_events


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


ENTER = ZoneEvent("zone_enter", "door", 3, 0)
CROSS = ZoneEvent("line_cross", "middle", 4, 1, direction="in")
EXIT = ZoneEvent("zone_exit", "door", 5, 2, dwell_s=1.5)


def hook(receiver: Receiver, **fields: Any) -> WebhookSettings:
    return WebhookSettings.model_validate({"id": "ops", "url": receiver.url, **fields})


def notifier(hub: ResultsHub, metrics: Metrics, *hooks: WebhookSettings, **kw: Any) -> Notifier:
    return Notifier(NotifySettings(webhooks=list(hooks), **kw), hub, metrics, NAMES)


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def deliveries(metrics: Metrics, outcome: str) -> float:
    return sample(metrics, "vdet_webhook_deliveries_total", webhook="ops", outcome=outcome)


async def until(predicate: Callable[[], object], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


# ------------------------------------------------------------------------ pure parts


def test_result_with_events_is_the_same_for_a_local_and_an_encoded_result() -> None:
    local = result("gate", ENTER, CROSS)
    numbered = DetectionResult(**{**local.__dict__, "seq": 12})
    encoded = EncodedResult(12, "gate", 7, encode_result_tail(local, NAMES))
    body = result_with_events(numbered, NAMES)
    assert body is not None and body == result_with_events(encoded, NAMES)
    assert body["seq"] == 12 and body["source_id"] == "gate" and body["frame_index"] == 7
    assert "detections" not in body and "timings_ms" not in body
    assert [e["type"] for e in body["events"]] == ["zone_enter", "line_cross"]
    assert body["events"][1] == {
        "type": "line_cross",
        "zone": "middle",
        "track_id": 4,
        "class_id": 1,
        "class_name": "car",
        "direction": "in",
        "dwell_s": None,
    }


def test_results_without_events_give_none_either_way() -> None:
    plain = result("gate")
    assert result_with_events(plain, NAMES) is None
    tail = encode_result_tail(plain, NAMES)
    assert result_with_events(EncodedResult(3, "gate", 7, tail), NAMES) is None
    # A class name that spells the marker is escaped in JSON and cannot fake "no events".
    tricky = ('x","events":[],"timings_ms":', "car", "dog")
    tail = encode_result_tail(result("gate", ENTER), tricky)
    assert result_with_events(EncodedResult(3, "gate", 7, tail), tricky) is not None


EVENTS = [
    {"type": "zone_enter", "zone": "door", "class_name": "person"},
    {"type": "line_cross", "zone": "middle", "class_name": "car"},
    {"type": "zone_exit", "zone": "door", "class_name": "dog"},
]


@pytest.mark.parametrize(
    ("fields", "source", "kept"),
    [
        ({}, "gate", [0, 1, 2]),
        ({"events": ["line_cross"]}, "gate", [1]),
        ({"zones": ["door"]}, "gate", [0, 2]),
        ({"classes": ["dog", "car"]}, "gate", [1, 2]),
        ({"streams": ["dock"]}, "gate", []),
        ({"streams": ["gate"], "events": ["zone_exit"], "classes": ["dog"]}, "gate", [2]),
        ({"zones": ["nowhere"]}, "gate", []),
    ],
)
def test_filters_keep_the_events_every_given_filter_allows(
    receiver: Receiver, fields: dict[str, Any], source: str, kept: list[int]
) -> None:
    f = EventFilter(hook(receiver, **fields))
    assert f.events(source, EVENTS) == [EVENTS[i] for i in kept]
    assert f.events(source, []) == []


def test_signature_is_hmac_sha256_of_the_time_and_the_body() -> None:
    body = b'{"webhook":"ops"}'
    expected = hmac.new(b"s3cret", b"1700000000." + body, hashlib.sha256).hexdigest()
    assert signature("s3cret", 1700000000, body) == f"t=1700000000,v1={expected}"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"url": "ftp://x/y"}, "url"),
        ({"url": "http://x/ y"}, "url"),
        ({"headers": {"Content-Type": "text/plain"}}, "set by vdet itself"),
        ({"headers": {"X-Vdet-Signature": "t=1"}}, "set by vdet itself"),
        ({"headers": {"bad header": "x"}}, "headers"),
        ({"events": ["zone_dance"]}, "events"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"url": "http://x/y", "tls_ca_file": "/etc/ca.pem"}, "https"),
        ({"extra": 1}, "extra"),
    ],
)
def test_bad_webhook_settings_are_refused(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        WebhookSettings.model_validate({"id": "ops", "url": "https://h.example/x", **fields})


def test_webhook_ids_are_unique_and_classes_known_to_the_model(receiver: Receiver) -> None:
    with pytest.raises(ValueError, match="unique"):
        NotifySettings(webhooks=[hook(receiver), hook(receiver)])
    with pytest.raises(ValueError, match=r"unknown classes \['cat'\]"):
        notifier(ResultsHub(), Metrics(), hook(receiver, classes=["cat", "dog"]))


# ----------------------------------------------------------- the notifier and the hub


async def test_events_reach_the_endpoint_signed_with_its_headers_and_nothing_else(
    receiver: Receiver,
) -> None:
    hub, metrics = ResultsHub(), Metrics()
    n = notifier(
        hub,
        metrics,
        hook(receiver, secret="s3cret-s3cret", headers={"Authorization": "Bearer tok"}),
    )
    n.start()
    try:
        await asyncio.sleep(0)  # the reader subscribes
        await asyncio.to_thread(hub.publish, result("gate"))  # no events: nothing sent
        sent = await asyncio.to_thread(hub.publish, result("gate", ENTER, EXIT, frame=9))
        await until(lambda: deliveries(metrics, "delivered") == 1)
    finally:
        await n.stop()
    ((headers, raw),) = receiver.requests
    body = json.loads(raw)
    assert body["webhook"] == "ops" and body["seq"] == sent.seq == 2
    assert (body["source_id"], body["frame_index"]) == ("gate", 9)
    assert (body["image_width"], body["image_height"]) == (1920, 1080)
    assert [(e["type"], e["class_name"]) for e in body["events"]] == [
        ("zone_enter", "person"),
        ("zone_exit", "dog"),
    ]
    assert headers["content-type"] == "application/json"
    assert headers["authorization"] == "Bearer tok"
    stamp = int(headers[SIGNATURE_HEADER.lower()].split(",")[0][2:])
    assert headers[SIGNATURE_HEADER.lower()] == signature("s3cret-s3cret", stamp, raw)
    assert abs(stamp - time.time()) < 60
    assert sample(metrics, "vdet_webhook_delivery_seconds_count", webhook="ops") == 1


async def test_results_published_before_the_webhooks_start_are_sent_too(
    receiver: Receiver,
) -> None:
    """Streams start before the app can start its webhooks: their first frames' events (a
    track entering a zone as the camera comes up) wait in the replay buffer."""
    hub, metrics = ResultsHub(), Metrics()
    hub.publish(result("gate", ENTER, frame=0))
    n = notifier(hub, metrics, hook(receiver))
    n.start()
    try:
        await until(lambda: len(receiver.requests) == 1)
    finally:
        await n.stop()
    assert receiver.bodies()[0]["frame_index"] == 0


async def test_each_webhook_gets_only_what_its_filters_keep(receiver: Receiver) -> None:
    hub, metrics = ResultsHub(), Metrics()
    lines = hook(receiver, events=["line_cross"]).model_copy(update={"id": "lines"})
    dock = hook(receiver, streams=["dock"]).model_copy(update={"id": "dock"})
    n = notifier(hub, metrics, lines, dock)
    n.start()
    try:
        await asyncio.sleep(0)
        await asyncio.to_thread(hub.publish, result("gate", ENTER, CROSS))
        await asyncio.to_thread(hub.publish, result("dock", ENTER))
        await until(lambda: len(receiver.requests) == 2)
        await asyncio.sleep(0.2)  # and no third
    finally:
        await n.stop()
    got = sorted(
        (b["webhook"], b["source_id"], [e["type"] for e in b["events"]]) for b in receiver.bodies()
    )
    assert got == [("dock", "dock", ["zone_enter"]), ("lines", "gate", ["line_cross"])]


async def test_5xx_and_429_are_retried_and_4xx_and_redirects_fail_at_once(
    receiver: Receiver,
) -> None:
    hub, metrics = ResultsHub(), Metrics()
    receiver.statuses = [503, 429, 200, 400, 302]
    n = notifier(hub, metrics, hook(receiver, max_attempts=3))
    n.start()
    try:
        await asyncio.sleep(0)
        for frame in (1, 2, 3):
            await asyncio.to_thread(hub.publish, result("gate", ENTER, frame=frame))
        await until(lambda: len(receiver.requests) == 5)
        await asyncio.sleep(0.2)
    finally:
        await n.stop()
    assert [b["frame_index"] for b in receiver.bodies()] == [1, 1, 1, 2, 3]
    assert sample(metrics, "vdet_webhook_retries_total", webhook="ops") == 2
    state = n.webhooks[0].state  # what GET /v1/webhooks shows
    assert (state.delivered, state.failed, state.dropped, state.retries) == (1, 2, 0, 2)
    assert state.last_error == "HTTP 302" and state.last_delivered_time is not None
    assert deliveries(metrics, "delivered") == 1
    assert deliveries(metrics, "failed") == 2


async def test_an_endpoint_that_does_not_answer_in_time_is_retried_then_failed(
    receiver: Receiver,
) -> None:
    hub, metrics = ResultsHub(), Metrics()
    receiver.delay_s = 0.5
    n = notifier(hub, metrics, hook(receiver, timeout_s=0.1, max_attempts=2))
    n.start()
    try:
        await asyncio.sleep(0)
        await asyncio.to_thread(hub.publish, result("gate", ENTER))
        await until(lambda: deliveries(metrics, "failed") == 1)
    finally:
        await n.stop()
    assert sample(metrics, "vdet_webhook_retries_total", webhook="ops") == 1


async def test_a_full_queue_drops_its_oldest_and_shutdown_drops_the_rest_after_the_grace(
    receiver: Receiver,
) -> None:
    hub, metrics = ResultsHub(), Metrics()
    receiver.gate.clear()  # the endpoint holds every request
    n = notifier(hub, metrics, hook(receiver, max_pending=2), shutdown_grace_s=0.2)
    n.start()
    try:
        await asyncio.sleep(0)
        for frame in range(1, 6):
            await asyncio.to_thread(hub.publish, result("gate", ENTER, frame=frame))
        (webhook,) = n.webhooks
        await until(lambda: webhook.pending == 3)  # one in flight, two waiting
        assert sample(metrics, "vdet_webhook_pending", webhook="ops") == 3
        assert deliveries(metrics, "dropped") == 2
    finally:
        started = time.monotonic()
        await n.stop()
        stopped_in = time.monotonic() - started
        receiver.gate.set()
    assert stopped_in < 2
    assert deliveries(metrics, "dropped") == 5
    assert sample(metrics, "vdet_webhook_pending", webhook="ops") == 0


async def test_a_reader_cut_off_as_lagging_resumes_from_the_replay_without_a_loss(
    receiver: Receiver,
) -> None:
    hub, metrics = ResultsHub(subscriber_queue_size=2), Metrics()
    n = notifier(hub, metrics, hook(receiver))
    n.start()
    try:
        await asyncio.sleep(0)
        # Published on the loop's own thread in one go: the reader's queue of 2 overflows.
        for frame in range(1, 11):
            hub.publish(result("gate", ENTER, frame=frame))
        await until(lambda: len(receiver.requests) == 10)
    finally:
        await n.stop()
    assert [b["frame_index"] for b in receiver.bodies()] == list(range(1, 11))
    assert sample(metrics, "vdet_notify_results_missed_total") == 0


async def test_results_that_left_the_replay_are_counted_as_missed(receiver: Receiver) -> None:
    hub = ResultsHub(subscriber_queue_size=2, capacity_total=3, capacity_per_source=3)
    metrics = Metrics()
    n = notifier(hub, metrics, hook(receiver))
    n.start()
    try:
        await asyncio.sleep(0)
        for frame in range(1, 11):
            hub.publish(result("gate", ENTER, frame=frame))
        await until(lambda: sample(metrics, "vdet_notify_results_missed_total") > 0)
        await until(lambda: len(receiver.requests) >= 3)
    finally:
        await n.stop()
    frames = [b["frame_index"] for b in receiver.bodies()]
    # What the reader had queued, then the replay's last three; the rest counted as missed.
    assert frames[-3:] == [8, 9, 10]
    assert sample(metrics, "vdet_notify_results_missed_total") == 10 - len(frames)


# ------------------------------------------------------------------------- the app


def test_the_app_sends_a_stream_s_zone_events_to_its_webhook(
    make_settings: MakeSettings, clip: Path, receiver: Receiver
) -> None:
    """The real app on a real H.264 clip: the tiny model's fixed boxes become tracks inside a
    zone over the whole frame, whose zone_enter events reach the endpoint."""
    zone = {"id": "all", "kind": "polygon", "points": [[0, 0], [1, 0], [1, 1], [0, 1]]}
    settings: Settings = make_settings(
        notify={"webhooks": [{"id": "ops", "url": receiver.url, "events": ["zone_enter"]}]},
        sources=[stream_body(clip, "gate", zones=[zone])],
    )
    with TestClient(create_app(settings)) as client:
        wait_until(lambda: receiver.requests, 20, what="a webhook delivery")
        metrics = client.get("/metrics").text
    body = receiver.bodies()[0]
    assert body["source_id"] == "gate" and body["webhook"] == "ops"
    assert (body["image_width"], body["image_height"]) == CLIP_WH
    assert body["events"] and {e["type"] for e in body["events"]} == {"zone_enter"}
    assert {e["zone"] for e in body["events"]} == {"all"}
    assert 'vdet_webhook_deliveries_total{outcome="delivered",webhook="ops"}' in metrics


def test_get_webhooks_shows_each_one_s_deliveries_without_credentials_and_needs_the_key(
    make_settings: MakeSettings, clip: Path, receiver: Receiver
) -> None:
    zone = {"id": "all", "kind": "polygon", "points": [[0, 0], [1, 0], [1, 1], [0, 1]]}
    with_credentials = receiver.url.replace("http://", "http://user:pa55word@")
    settings = make_settings(
        api_key="k3y-k3y-k3y",
        notify={
            "webhooks": [
                {"id": "ops", "url": with_credentials, "secret": "s3cret", "zones": ["all"]}
            ]
        },
        sources=[stream_body(clip, "gate", zones=[zone])],
    )
    with TestClient(create_app(settings)) as client:
        assert client.get("/v1/webhooks").status_code == 401
        wait_until(lambda: receiver.requests, 20, what="a webhook delivery")
        key = {"X-API-Key": "k3y-k3y-k3y"}
        wait_until(
            lambda: client.get("/v1/webhooks", headers=key).json()["webhooks"][0]["delivered"],
            10,
            what="the delivery counted",
        )
        r = client.get("/v1/webhooks", headers=key)
    assert r.status_code == 200
    (hook,) = r.json()["webhooks"]
    assert "pa55word" not in r.text and hook["url"].startswith("http://***@127.0.0.1:")
    assert (hook["id"], hook["signed"], hook["zones"], hook["events"]) == (
        "ops",
        True,
        ["all"],
        None,
    )
    assert hook["failed"] == hook["dropped"] == 0 and hook["last_delivered_time"] is not None
    headers, _ = receiver.requests[0]
    assert headers["authorization"].startswith("Basic ")  # the URL's credentials, sent as such


def test_a_test_delivery_says_how_it_went_and_leaves_the_counts_alone(
    make_settings: MakeSettings, receiver: Receiver
) -> None:
    settings = make_settings(
        notify={"webhooks": [{"id": "ops", "url": receiver.url, "secret": "s3cret"}]}
    )
    with TestClient(create_app(settings)) as client:
        r = client.post("/v1/webhooks/ops/test")
        assert r.status_code == 200, r.text
        assert r.json()["delivered"] is True and r.json()["error"] is None
        receiver.statuses = [500]
        assert client.post("/v1/webhooks/ops/test").json()["error"] == "HTTP 500"
        assert client.post("/v1/webhooks/nope/test").status_code == 404

        receiver.gate.clear()  # the endpoint holds the next test: a second one must wait
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(client.post, "/v1/webhooks/ops/test")
            wait_until(lambda: receiver.waiting, 5, what="the first test at the endpoint")
            second = client.post("/v1/webhooks/ops/test")
            receiver.gate.set()
            assert first.result(10).json()["delivered"] is True
        assert second.status_code == 409 and "under way" in second.json()["detail"]
        (hook,) = client.get("/v1/webhooks").json()["webhooks"]
    assert (hook["delivered"], hook["failed"], hook["pending"]) == (0, 0, 0)
    headers, raw = receiver.requests[0]
    body = json.loads(raw)
    assert (body["webhook"], body["test"], body["events"]) == ("ops", True, [])
    stamp = int(headers["x-vdet-signature"].split(",")[0][2:])
    assert headers["x-vdet-signature"] == signature("s3cret", stamp, raw)


def test_https_endpoints_are_checked_against_the_system_s_cas_or_the_webhook_s_own(
    make_settings: MakeSettings, tmp_path: Path
) -> None:
    """A real HTTPS endpoint whose certificate a CA of the site's own signed (openssl): the
    webhook given that CA delivers, one checking the system's CAs refuses the endpoint, and a
    CA file that is no CA stops the start with the webhook's and the file's names."""
    ca, cert, key = self_signed_ca(tmp_path)
    receiver = Receiver(tls=(cert, key))
    try:
        hooks = [
            {"id": "site", "url": receiver.url, "tls_ca_file": str(ca)},
            {"id": "public", "url": receiver.url},
        ]
        with TestClient(create_app(make_settings(notify={"webhooks": hooks}))) as client:
            site = client.post("/v1/webhooks/site/test").json()
            assert site["delivered"] is True, site
            public = client.post("/v1/webhooks/public/test").json()
            assert public["delivered"] is False
            assert "CERTIFICATE_VERIFY_FAILED" in public["error"], public
        assert len(receiver.requests) == 1
    finally:
        receiver.close()

    broken = [{"id": "site", "url": "https://127.0.0.1:9/x", "tls_ca_file": str(key)}]
    with (
        pytest.raises(ValueError, match=f"notify.webhooks 'site': tls_ca_file {key}") as raised,
        TestClient(create_app(make_settings(notify={"webhooks": broken}))),
    ):
        pass
    print(raised.value)


def test_without_webhooks_get_webhooks_is_an_empty_list(client: TestClient) -> None:
    assert client.get("/v1/webhooks").json() == {"webhooks": []}


def test_the_app_refuses_to_start_with_a_webhook_class_the_model_lacks(
    make_settings: MakeSettings, receiver: Receiver
) -> None:
    settings = make_settings(
        notify={"webhooks": [{"id": "ops", "url": receiver.url, "classes": ["unicorn"]}]}
    )
    with pytest.raises(ValueError, match="unknown classes"), TestClient(create_app(settings)):
        pass


def test_the_receiver_check_in_the_docs_accepts_vdet_s_signature_and_nothing_else() -> None:
    doc = (REPO / "docs" / "notify.md").read_text()
    code = re.search(r"```python\n(.*?)```", doc, re.S)
    assert code is not None
    scope: dict[str, Any] = {}
    exec(code.group(1), scope)
    verified = scope["verified"]
    now, body = int(time.time()), b'{"webhook":"ops","seq":1}'
    assert verified(b"s3cret", signature("s3cret", now, body), body)
    assert not verified(b"s3cret", signature("s3cret", now, body), body + b" ")
    assert not verified(b"other", signature("s3cret", now, body), body)
    assert not verified(b"s3cret", signature("s3cret", now - 3600, body), body)
