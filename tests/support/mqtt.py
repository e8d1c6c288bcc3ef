"""A real MQTT broker for tests (Debian's mosquitto on a loopback port) and a subscriber that
records what it receives (paho-mqtt, as vdet uses it)."""

from __future__ import annotations

import json
import subprocess
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

    def __init__(
        self,
        folder: Path,
        port: int | None = None,
        *,
        users: dict[str, str] | None = None,
        tls: tuple[Path, Path] | None = None,
    ) -> None:
        """`users` (name -> password): only they may connect; `tls` (certificate, key): the
        listener speaks TLS only."""
        self.exe = require_tool("mosquitto", provided_by="Debian package mosquitto")
        self.port = port or free_port()
        self.folder = folder
        self.config = folder / f"mosquitto-{self.port}.conf"
        # As root, mosquitto would read its password and key files as user `mosquitto`, which
        # cannot enter a private temporary folder.
        lines = [f"listener {self.port} 127.0.0.1", "persistence false", "user root"]
        if users:
            passwords = folder / f"mosquitto-{self.port}.passwd"
            passwords.write_text("")
            tool = require_tool("mosquitto_passwd", provided_by="Debian package mosquitto")
            for name, password in users.items():
                subprocess.run([tool, "-b", str(passwords), name, password], check=True)
            lines += ["allow_anonymous false", f"password_file {passwords}"]
        else:
            lines.append("allow_anonymous true")
        if tls is not None:
            lines += [f"certfile {tls[0]}", f"keyfile {tls[1]}"]
        self.config.write_text("\n".join(lines) + "\n")
        self.process: Process | None = None

    def start(self) -> Broker:
        self.process = Process(
            [self.exe, "-c", str(self.config)], self.folder / f"mosquitto-{self.port}.log"
        )
        try:
            wait_until(lambda: port_accepts(self.port), 10, what="mosquitto listening")
        except AssertionError:
            log = self.process.log_tail()
            self.stop()
            raise AssertionError(f"mosquitto did not start: {log}") from None
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None


class Subscriber:
    """A client subscribed to `topic` that keeps (topic, payload, retained) in order."""

    def __init__(
        self,
        broker: Broker,
        topic: str = "vdet/#",
        *,
        user: tuple[str, str] | None = None,
        ca_file: Path | None = None,
    ) -> None:
        self.messages: list[tuple[str, bytes, bool]] = []
        self._lock = threading.Lock()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"test-{free_port()}")
        if user is not None:
            self.client.username_pw_set(*user)
        if ca_file is not None:
            self.client.tls_set(ca_certs=str(ca_file))
        self.client.on_message = self._on_message
        self.client.on_connect = lambda c, *_: c.subscribe(topic, qos=1)
        self.client.connect("127.0.0.1", broker.port)
        self.client.loop_start()

    def _on_message(self, client: mqtt.Client, userdata: Any, message: mqtt.MQTTMessage) -> None:
        with self._lock:
            self.messages.append((message.topic, bytes(message.payload), bool(message.retain)))

    def raw(self, topic: str) -> list[bytes]:
        with self._lock:
            return [payload for t, payload, _ in self.messages if t == topic]

    def on(self, topic: str) -> list[str]:
        """The payloads of `topic` as text."""
        return [payload.decode() for payload in self.raw(topic)]

    def events(self, topic: str) -> list[dict[str, Any]]:
        return [json.loads(payload) for payload in self.on(topic)]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()
