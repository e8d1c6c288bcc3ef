"""A real MQTT broker for tests (Debian's mosquitto on a loopback port) and a subscriber that
records what it receives (paho-mqtt, as vdet uses it)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from support.procs import Process
from support.rtsp import free_port, port_accepts
from support.tools import require_tool
from support.waiting import wait_until


class Broker:
    """mosquitto listening on 127.0.0.1:`port`, anonymous, nothing persisted; `start` and
    `stop` may be called again (a broker that goes away and comes back on the same port)."""

    def __init__(self, folder: Path, port: int | None = None) -> None:
        self.exe = require_tool("mosquitto", provided_by="Debian package mosquitto")
        self.port = port or free_port()
        self.folder = folder
        self.config = folder / f"mosquitto-{self.port}.conf"
        self.config.write_text(
            f"listener {self.port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
        )
        self.process: Process | None = None

    def start(self) -> Broker:
        self.process = Process(
            [self.exe, "-c", str(self.config)], self.folder / f"mosquitto-{self.port}.log"
        )
        wait_until(lambda: port_accepts(self.port), 10, what="mosquitto listening")
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None


class Subscriber:
    """A client subscribed to `topic` that keeps (topic, payload text, retained) in order."""

    def __init__(self, broker: Broker, topic: str = "vdet/#") -> None:
        self.messages: list[tuple[str, str, bool]] = []
        self._lock = threading.Lock()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"test-{free_port()}")
        self.client.on_message = self._on_message
        self.client.on_connect = lambda c, *_: c.subscribe(topic, qos=1)
        self.client.connect("127.0.0.1", broker.port)
        self.client.loop_start()

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        with self._lock:
            self.messages.append((message.topic, message.payload.decode(), bool(message.retain)))

    def on(self, topic: str) -> list[str]:
        with self._lock:
            return [payload for t, payload, _ in self.messages if t == topic]

    def events(self, topic: str) -> list[dict[str, Any]]:
        return [json.loads(payload) for payload in self.on(topic)]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()
