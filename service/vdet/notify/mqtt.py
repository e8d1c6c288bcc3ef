"""MQTT: the streams' zone and line events published to a broker (`notify.mqtt`).

Topics (`<prefix>`: `topic_prefix`, default `vdet`):

- `<prefix>/status`: `online` once connected, `offline` at a clean stop, both retained; the
  broker publishes `offline` itself (the connection's will) when vdet vanishes without one.
- `<prefix>/streams/<stream id>/events`: one JSON message per result whose frame caused events
  that the filters keep, the same body as a webhook's without its `webhook` field.
- `<prefix>/streams/<stream id>/snapshot` (with `snapshots`): that frame's event snapshot, a
  JPEG, retained: the stream's latest event picture. With `home_assistant`, Home Assistant's
  MQTT discovery learns of it first (`<discovery prefix>/camera/<client id>/<stream>/config`).

paho-mqtt runs the connection in a thread of its own (connect, reconnect every 1-30 s, keepalive,
acknowledgements); publishing from the event loop only queues. Messages of QoS 1 and 2 wait in
paho's queue while the broker is away and go out once it is back; beyond `max_queued` a new one
is dropped, as is a QoS 0 message while there is no connection. Each ends counted in
`vdet_mqtt_messages_total` as published (sent at QoS 0, acknowledged at 1 and 2) or dropped.
The Notifier (vdet.notify.webhooks) decides which results reach it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import ssl
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.reasoncodes import ReasonCode

from vdet.config.notify import MqttSettings
from vdet.metrics.registry import Metrics
from vdet.notify.filters import EventFilter

log = logging.getLogger(__name__)

_RECONNECT_MIN_S, _RECONNECT_MAX_S = 1, 30


class MqttPublisher:
    """One broker connection for the events (module docstring). `start`, `publish`, `stop`."""

    def __init__(self, spec: MqttSettings, metrics: Metrics) -> None:
        self.spec = spec
        self.filter = EventFilter(spec)
        self.status_topic = f"{spec.topic_prefix}/status"
        self._published = metrics.mqtt_messages.labels("published")
        self._dropped = metrics.mqtt_messages.labels("dropped")
        self._where = f"{spec.host}:{spec.port}"
        self._connected = metrics.mqtt_connected.labels(self._where)
        self._connected.set(0)
        ca_file = None if spec.tls_ca_file is None else str(spec.tls_ca_file)
        if ca_file is not None:  # checked before a client (and its sockets) exists
            try:
                ssl.create_default_context(cafile=ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(f"notify.mqtt.tls_ca_file {ca_file}: {exc}") from exc
        self._ca_file = ca_file
        self._client: mqtt.Client | None = None  # made by start(): its sockets with it
        self._status_mids: set[int] = set()  # `online` / `offline`: not counted as events
        self._announced: set[str] = set()  # streams whose camera Home Assistant was told of

    def start(self) -> None:
        """Connect in paho's thread; an absent broker is retried there, never waited for."""
        spec = self.spec
        client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=spec.client_id)
        if spec.username is not None:
            password = None if spec.password is None else spec.password.get_secret_value()
            client.username_pw_set(spec.username, password)
        if spec.tls or self._ca_file is not None:
            # The broker's certificate and name are checked, against the system's CAs unless
            # a CA file is given.
            client.tls_set(ca_certs=self._ca_file)
        client.will_set(self.status_topic, "offline", qos=1, retain=True)
        client.max_queued_messages_set(spec.max_queued)
        client.reconnect_delay_set(_RECONNECT_MIN_S, _RECONNECT_MAX_S)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_publish = self._on_publish
        self._client = client
        client.connect_async(spec.host, spec.port, spec.keepalive_s)
        client.loop_start()

    def publish(self, source_id: str, body: dict[str, Any]) -> None:
        """Queue one stream's events message (never blocks)."""
        payload = json.dumps(body, separators=(",", ":"))
        self._send(f"{self.spec.topic_prefix}/streams/{source_id}/events", payload, retain=False)

    def publish_clip(self, source_id: str, body: dict[str, Any]) -> None:
        """Queue a finished event clip's message (never blocks)."""
        payload = json.dumps(body, separators=(",", ":"))
        self._send(f"{self.spec.topic_prefix}/streams/{source_id}/clips", payload, retain=False)

    def publish_snapshot(self, source_id: str, jpeg: bytes) -> None:
        """Queue a stream's latest event snapshot, retained (never blocks); with
        `home_assistant`, its camera is announced first, once per stream."""
        topic = f"{self.spec.topic_prefix}/streams/{source_id}/snapshot"
        if self.spec.home_assistant and source_id not in self._announced:
            self._announced.add(source_id)
            self._send(*self._camera_discovery(source_id, topic), retain=True)
        self._send(topic, jpeg, retain=True)

    def _camera_discovery(self, source_id: str, topic: str) -> tuple[str, str]:
        """Home Assistant's MQTT discovery config for a stream's snapshot camera: (its topic,
        its JSON). Ids there are letters, digits, '_' and '-': a stream id's dots become '_'."""
        node = self.spec.client_id.replace(".", "_")
        object_id = source_id.replace(".", "_")
        config = {
            "name": f"{source_id} last event",
            "unique_id": f"{node}_{object_id}_event_snapshot",
            "topic": topic,
            "availability_topic": self.status_topic,
            "device": {"identifiers": [node], "name": f"vdet {self.spec.client_id}"},
        }
        where = f"{self.spec.discovery_prefix}/camera/{node}/{object_id}/config"
        return where, json.dumps(config, separators=(",", ":"))

    def _send(self, topic: str, payload: str | bytes, *, retain: bool) -> None:
        if self._client is None:  # not started: nowhere to queue it
            self._dropped.inc()
            return
        info = self._client.publish(topic, payload, qos=self.spec.qos, retain=retain)
        queued = info.rc == mqtt.MQTT_ERR_SUCCESS or (
            info.rc == mqtt.MQTT_ERR_NO_CONN and self.spec.qos > 0  # sent once reconnected
        )
        if not queued:
            self._dropped.inc()

    def stop(self, timeout_s: float) -> None:
        """Say `offline` (retained) and disconnect cleanly, waiting up to `timeout_s` for what
        is queued; blocks (call it off the event loop)."""
        client, self._client = self._client, None
        if client is None:
            return
        if client.is_connected():
            info = client.publish(self.status_topic, "offline", qos=1, retain=True)
            self._status_mids.add(info.mid)
            # Not queued after all (RuntimeError, ValueError): disconnecting anyway.
            with contextlib.suppress(RuntimeError, ValueError):
                info.wait_for_publish(timeout_s)
        client.disconnect()
        client.loop_stop()
        self._connected.set(0)

    # --- paho's thread ---------------------------------------------------------------------

    def _on_connect(
        self, client: mqtt.Client, userdata: Any, flags: Any, reason: ReasonCode, props: Any
    ) -> None:
        if reason.is_failure:
            log.warning("MQTT broker %s refused the connection: %s", self._where, reason)
            return
        log.info("MQTT connected to %s", self._where)
        self._connected.set(1)
        info = client.publish(self.status_topic, "online", qos=1, retain=True)
        self._status_mids.add(info.mid)

    def _on_disconnect(
        self, client: mqtt.Client, userdata: Any, flags: Any, reason: ReasonCode, props: Any
    ) -> None:
        self._connected.set(0)
        if reason.is_failure:
            log.warning("MQTT connection to %s lost (%s); reconnecting", self._where, reason)

    def _on_publish(
        self, client: mqtt.Client, userdata: Any, mid: int, reason: ReasonCode, props: Any
    ) -> None:
        if mid in self._status_mids:
            self._status_mids.discard(mid)  # not an event message
        else:
            self._published.inc()


__all__ = ["MqttPublisher"]
