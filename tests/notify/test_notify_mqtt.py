"""MQTT: zone and line events published to a real broker (Debian's mosquitto on a loopback
port) from the real results hub, read back by a real subscriber: topics, bodies, filters, the
retained status and the broker's will, a broker that comes up late, and the app end to end."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import cv2
import numpy as np
import pytest
from support.apptest import CLIP_WH, MakeSettings, TestClient, stream_body
from support.mqtt import Broker, Subscriber
from support.results import NAMES, result
from support.tls import self_signed_ca
from support.waiting import wait_until

from vdet.api.app import create_app
from vdet.config.notify import MqttSettings, NotifySettings
from vdet.core.types import ZoneEvent
from vdet.metrics.registry import Metrics
from vdet.notify.notifier import Notifier
from vdet.results.hub import ResultsHub

ENTER = ZoneEvent("zone_enter", "door", 3, 0)
CROSS = ZoneEvent("line_cross", "middle", 4, 1, direction="in")


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    b = Broker(tmp_path).start()
    yield b
    b.stop()


@pytest.fixture
def subscriber(broker: Broker) -> Iterator[Subscriber]:
    s = Subscriber(broker)
    wait_until(lambda: s.client.is_connected(), 5, what="the test subscriber connected")
    time.sleep(0.1)  # its SUBSCRIBE acknowledged
    yield s
    s.close()


def settings(broker: Broker, **fields: object) -> NotifySettings:
    return NotifySettings.model_validate(
        {"mqtt": {"host": "127.0.0.1", "port": broker.port, **fields}, "shutdown_grace_s": 2}
    )


def value(metrics: Metrics, name: str, **labels: str) -> float:
    found = metrics.registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


def connected(metrics: Metrics, broker: Broker) -> float:
    return value(metrics, "vdet_mqtt_connected", broker=f"127.0.0.1:{broker.port}")


async def until(predicate: Callable[[], object], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_events_go_to_their_stream_s_topic_and_the_status_is_retained(
    broker: Broker, subscriber: Subscriber
) -> None:
    hub, metrics = ResultsHub(), Metrics()
    n = Notifier(settings(broker, events=["line_cross", "zone_enter"]), hub, metrics, NAMES)
    n.start()
    try:
        await until(lambda: subscriber.on("vdet/status") == ["online"])
        assert connected(metrics, broker) == 1
        await asyncio.to_thread(hub.publish, result("gate"))  # no events: no message
        await asyncio.to_thread(hub.publish, result("gate", ENTER, CROSS, frame=4))
        await asyncio.to_thread(hub.publish, result("dock", CROSS, frame=5))
        await until(lambda: len(subscriber.on("vdet/streams/dock/events")) == 1)
        await until(lambda: value(metrics, "vdet_mqtt_messages_total", outcome="published") == 2)
    finally:
        await n.stop()
    await until(lambda: subscriber.on("vdet/status")[-1:] == ["offline"])
    (gate,) = subscriber.events("vdet/streams/gate/events")
    assert (gate["seq"], gate["source_id"], gate["frame_index"]) == (2, "gate", 4)
    assert [e["type"] for e in gate["events"]] == ["zone_enter", "line_cross"]
    assert "webhook" not in gate and "detections" not in gate
    assert connected(metrics, broker) == 0
    # A subscriber that comes later still learns vdet's state from the retained status.
    late = Subscriber(broker, "vdet/status")
    try:
        wait_until(lambda: late.on("vdet/status"), 5, what="the retained status")
        assert late.messages[0][1:] == (b"offline", True)
    finally:
        late.close()


async def test_filters_and_the_topic_prefix_apply(broker: Broker) -> None:
    sub = Subscriber(broker, "site-7/cams/#")
    wait_until(lambda: sub.client.is_connected(), 5, what="the subscriber connected")
    hub, metrics = ResultsHub(), Metrics()
    spec = settings(broker, topic_prefix="site-7/cams", streams=["gate"], classes=["car"])
    n = Notifier(spec, hub, metrics, NAMES)
    n.start()
    try:
        await until(lambda: sub.on("site-7/cams/status") == ["online"])
        await asyncio.to_thread(hub.publish, result("dock", CROSS))  # another stream
        await asyncio.to_thread(hub.publish, result("gate", ENTER))  # a person
        await asyncio.to_thread(hub.publish, result("gate", ENTER, CROSS, frame=9))
        await until(lambda: sub.on("site-7/cams/streams/gate/events"))
        await asyncio.sleep(0.2)
    finally:
        await n.stop()
        sub.close()
    (only,) = sub.events("site-7/cams/streams/gate/events")
    assert only["frame_index"] == 9 and [e["class_name"] for e in only["events"]] == ["car"]
    assert not sub.on("site-7/cams/streams/dock/events")


async def test_a_broker_that_comes_up_late_gets_the_events_queued_meanwhile(
    tmp_path: Path,
) -> None:
    broker = Broker(tmp_path)  # not started yet
    hub, metrics = ResultsHub(), Metrics()
    n = Notifier(settings(broker), hub, metrics, NAMES)
    n.start()
    sub: Subscriber | None = None
    try:
        await asyncio.sleep(0.3)
        assert connected(metrics, broker) == 0
        for frame in (1, 2):
            await asyncio.to_thread(hub.publish, result("gate", ENTER, frame=frame))
        await asyncio.sleep(0.1)
        broker.start()
        sub = Subscriber(broker)  # subscribed before vdet's next reconnect (1 s apart at first)
        await until(lambda: len(sub.on("vdet/streams/gate/events")) == 2, timeout=40)
        assert connected(metrics, broker) == 1
    finally:
        await n.stop()
        if sub is not None:
            sub.close()
        broker.stop()
    assert [e["frame_index"] for e in sub.events("vdet/streams/gate/events")] == [1, 2]
    assert value(metrics, "vdet_mqtt_messages_total", outcome="dropped") == 0


def test_the_broker_says_offline_when_vdet_vanishes_without_a_word(
    broker: Broker, subscriber: Subscriber
) -> None:
    """The will: a process that dies (no DISCONNECT) is reported offline by the broker."""
    script = f"""
import os, time
from vdet.notify.mqtt import MqttPublisher
from vdet.config.notify import MqttSettings
from vdet.metrics.registry import Metrics
metrics = Metrics()
MqttPublisher(MqttSettings(host="127.0.0.1", port={broker.port}), metrics).start()
deadline = time.monotonic() + 10
connected = metrics.mqtt_connected.labels("127.0.0.1:{broker.port}")
while connected._value.get() != 1 and time.monotonic() < deadline:
    time.sleep(0.02)
time.sleep(0.3)
os._exit(0)
"""
    subprocess.run([sys.executable, "-c", script], check=True, timeout=30)
    wait_until(lambda: subscriber.on("vdet/status") == ["online", "offline"], 10, what="the will")


def test_the_app_publishes_a_stream_s_zone_events(
    make_settings: MakeSettings, clip: Path, broker: Broker, subscriber: Subscriber
) -> None:
    """The real app on a real H.264 clip: the tiny model's fixed boxes become tracks inside a
    zone over the whole frame, whose zone_enter events reach the broker."""
    zone = {"id": "all", "kind": "polygon", "points": [[0, 0], [1, 0], [1, 1], [0, 1]]}
    app_settings = make_settings(
        notify={"mqtt": {"host": "127.0.0.1", "port": broker.port}},
        sources=[stream_body(clip, "gate", zones=[zone])],
    )
    with TestClient(create_app(app_settings)) as client:
        wait_until(lambda: subscriber.on("vdet/streams/gate/events"), 20, what="an events message")
        metrics = client.get("/metrics").text
    body = subscriber.events("vdet/streams/gate/events")[0]
    assert {e["type"] for e in body["events"]} == {"zone_enter"}
    assert "vdet_mqtt_connected" in metrics
    wait_until(lambda: subscriber.on("vdet/status")[-1:] == ["offline"], 5, what="offline")


def test_with_snapshots_the_app_publishes_each_event_frame_s_jpeg_retained(
    make_settings: MakeSettings, clip: Path, broker: Broker, subscriber: Subscriber
) -> None:
    """The frame of each events message, as the JPEG `GET .../snapshots/{frame}.jpg` serves,
    on `<prefix>/streams/<id>/snapshot`, retained: a client that subscribes later (a Home
    Assistant MQTT camera) gets the latest at once."""
    zone = {"id": "all", "kind": "polygon", "points": [[0, 0], [1, 0], [1, 1], [0, 1]]}
    mqtt = {"host": "127.0.0.1", "port": broker.port, "snapshots": True, "home_assistant": True}
    app_settings = make_settings(
        notify={"mqtt": mqtt}, sources=[stream_body(clip, "gate.north", zones=[zone])]
    )
    topic = "vdet/streams/gate.north/snapshot"
    discovery = Subscriber(broker, "homeassistant/#")
    with TestClient(create_app(app_settings)) as client:
        jpeg = wait_until(lambda: subscriber.raw(topic), 20, what="a snapshot message")[0]
        image = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
        assert image is not None and image.shape[:2] == (CLIP_WH[1], CLIP_WH[0])
        body = subscriber.events("vdet/streams/gate.north/events")[0]
        served = client.get(body["snapshot"])
        assert served.status_code == 200 and served.content == jpeg
        late = Subscriber(broker, topic)
        try:
            wait_until(lambda: late.messages, 10, what="the retained snapshot")
            assert late.messages[0][2] is True, "retained"
        finally:
            late.close()
    # Home Assistant learnt of the camera, once (its id's dot made '_').
    try:
        (config,) = discovery.events("homeassistant/camera/vdet/gate_north/config")
    finally:
        discovery.close()
    assert config == {
        "name": "gate.north last event",
        "unique_id": "vdet_gate_north_event_snapshot",
        "topic": topic,
        "availability_topic": "vdet/status",
        "device": {"identifiers": ["vdet"], "name": "vdet vdet"},
    }


def test_home_assistant_discovery_needs_snapshots() -> None:
    with pytest.raises(ValueError, match="set snapshots too"):
        MqttSettings(host="h", home_assistant=True)


def test_snapshots_over_mqtt_need_event_snapshots(
    make_settings: MakeSettings, broker: Broker
) -> None:
    app_settings = make_settings(
        notify={"mqtt": {"host": "127.0.0.1", "port": broker.port, "snapshots": True}},
        event_snapshots={"per_stream": 0},
    )
    with (
        pytest.raises(ValueError, match=r"needs event_snapshots\.per_stream"),
        TestClient(create_app(app_settings)),
    ):
        pass


async def test_a_broker_with_tls_and_passwords_gets_events_only_from_the_right_user(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """TLS checked against a site's own CA (`tls_ca_file`), with a name and password."""
    ca, cert, key = self_signed_ca(tmp_path)
    broker = Broker(tmp_path, users={"vdet": "s3cret-pw", "reader": "r3ad"}, tls=(cert, key))
    broker.start()
    sub = Subscriber(broker, user=("reader", "r3ad"), ca_file=ca)
    hub, metrics = ResultsHub(), Metrics()
    secure = {"tls_ca_file": str(ca), "username": "vdet", "password": "s3cret-pw"}
    n = Notifier(settings(broker, **secure), hub, metrics, NAMES)
    wrong = Notifier(settings(broker, **{**secure, "password": "nope"}), hub, Metrics(), NAMES)
    n.start()
    try:
        await until(lambda: sub.on("vdet/status") == ["online"])
        await asyncio.to_thread(hub.publish, result("gate", ENTER))
        await until(lambda: len(sub.on("vdet/streams/gate/events")) == 1)
        with caplog.at_level(logging.WARNING, logger="vdet.notify.mqtt"):
            wrong.start()
            await until(lambda: "refused the connection" in caplog.text)
        assert connected(metrics, broker) == 1
    finally:
        await wrong.stop()
        await n.stop()
        sub.close()
        broker.stop()


def test_a_ca_file_that_cannot_be_read_stops_the_start(tmp_path: Path) -> None:
    spec = NotifySettings.model_validate(
        {"mqtt": {"host": "127.0.0.1", "tls_ca_file": str(tmp_path / "missing.pem")}}
    )
    with pytest.raises(ValueError, match="tls_ca_file"):
        Notifier(spec, ResultsHub(), Metrics(), NAMES)


def test_an_mqtt_class_the_model_lacks_stops_the_start(broker: Broker) -> None:
    with pytest.raises(ValueError, match=r"notify.mqtt: unknown classes \['unicorn'\]"):
        Notifier(settings(broker, classes=["unicorn"]), ResultsHub(), Metrics(), NAMES)


def test_with_clips_the_app_publishes_each_finished_clip(
    make_settings: MakeSettings,
    clip: Path,
    broker: Broker,
    subscriber: Subscriber,
    tmp_path: Path,
) -> None:
    """A clip's message once its post-roll has passed, on <prefix>/streams/<id>/clips."""
    zone = {"id": "all", "kind": "polygon", "points": [[0, 0], [1, 0], [1, 1], [0, 1]]}
    app_settings = make_settings(
        notify={"mqtt": {"host": "127.0.0.1", "port": broker.port}},
        clips={"folder": str(tmp_path / "clips"), "pre_roll_s": 0.5, "post_roll_s": 0.5},
        sources=[stream_body(clip, "gate", zones=[zone])],
    )
    with TestClient(create_app(app_settings)) as client:
        wait_until(lambda: subscriber.on("vdet/streams/gate/clips"), 20, what="a clip message")
        listed = client.get("/v1/streams/gate/clips").json()["clips"]
    body = subscriber.events("vdet/streams/gate/clips")[0]
    assert body["source_id"] == "gate"
    assert body["clip"]["clip_id"] in {c["clip_id"] for c in listed}
    assert body["clip"]["url"] == f"/v1/streams/gate/clips/{body['clip']['clip_id']}"
    assert {e["type"] for e in body["events"]} == {"zone_enter"}
