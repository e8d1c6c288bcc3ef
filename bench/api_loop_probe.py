"""The API process of `vdet serve` under a worker node's result load, on a CPU: event-loop lag
and WebSocket client latency at paced result rates, for variants of the loop's settings.

Real parts: K producer processes stand for the stream worker processes and send what a worker
sends (`Channel.send(PublishedBatch((Published.of(handle, result, tail),)))`: a paced worker's
batch holds one result; real pickles of 1080p-shaped
results with 10 detections and their encoded tail) into real pipes at a paced total rate; in
the API process the product's reader (`vdet.workers.inbox.Inbox` on the server's event loop, as in
`vdet serve`) hands each result to what `WorkerPool` does with it (`ResultsHub.publish_encoded`,
`Metrics.observe`); the app is the real one
(`create_app`, as `vdet serve` starts it, streams in-process and none running, under uvicorn
with the settings `vdet serve` uses), so the hub, /v1/events and the loop-lag probe
(`vdet_api_event_loop_lag_seconds`, vdet.api.loop_health) are the product's. N WebSocket
clients, each in its own process, read /v1/events and time each result from the moment its
producer sent it.

Variants change only the API process's settings between windows (same server, clients and
producers), alternating within each round, so that a shared machine's load falls on all alike:

- unbounded: the hub's outbox hands a whole burst to the subscriptions in one loop callback
  (as before `_Outbox.batch`), GIL switch interval Python's default (5 ms);
- batch64: at most 64 results per callback (`_Outbox.batch`), the rest in later ones;
- switch1ms: unbounded, `sys.setswitchinterval(0.001)` (the loop thread waits less for the
  GIL behind reader threads);
- both: batch64 and switch1ms.

`--readers thread` reads the pipes on the inbox's own thread (as `WorkerPool` does without a
loop), `--readers per-pipe` each pipe on a thread of its own (as `WorkerPool` did before the
inbox); a run of its own each: compare runs alternated; `--profile-out` writes a
cProfile of the event-loop thread. Clients cut off as `lagging` resume with `?after=`, as
clients should.

    .venv/bin/python bench/api_loop_probe.py --rates 1000 2000 --out result.json
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import multiprocessing
import os
import platform
import statistics
import sys
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

DETECTIONS = 10
SOURCES = 64
# A placeholder publish time in the pre-encoded tail, replaced by the real send time.
_MARK = 1000000000.125


def _messages(offset: int, count: int) -> list[Any]:
    """`count` results of this producer's streams, encoded as a worker encodes them."""
    import dataclasses

    import numpy as np

    from vdet.core.types import DetectionResult, Detections, StageTimings
    from vdet.results.wire import encode_result_tail

    names = tuple(f"class{i}" for i in range(80))
    rng = np.random.default_rng(offset)
    out = []
    for i in range(count):
        xy = rng.uniform(0, 1000, (DETECTIONS, 2)).astype(np.float32)
        dets = Detections(
            np.concatenate([xy, xy + 50], axis=1),
            rng.uniform(0.3, 1, DETECTIONS).astype(np.float32),
            rng.integers(0, 80, DETECTIONS).astype(np.int32),
        )
        result = DetectionResult(
            f"cam{(offset + i) % SOURCES}",
            i,
            i / 30,
            _MARK,
            _MARK,
            (1920, 1080),
            dets,
            StageTimings(0.001, 0.002, 0.003, 0.001, 0.01),
        )
        out.append(dataclasses.replace(result, encoded_tail=encode_result_tail(result, names)))
    return out


def _produce(index: int, data: Connection, control: Connection) -> None:
    """One stand-in worker: on each (rate, until) command, send results paced at `rate` per
    second until the wall-clock time `until`; None ends it."""
    import dataclasses

    from vdet.workers.channel import Channel, Published, PublishedBatch

    channel = Channel(data)
    results = _messages(index * 16, 256)
    mark = repr(_MARK)
    sent = 0
    control.send("ready")
    while (command := control.recv()) is not None:
        rate, until = command
        start = time.time()
        n = 0
        while (now := time.time()) < until:
            due = start + n / rate
            if now < due:
                time.sleep(due - now)
                now = time.time()
            result = results[sent % len(results)]
            tail = result.encoded_tail.replace(mark, repr(now))
            now_result = dataclasses.replace(
                result, published_time=now, frame_index=sent, encoded_tail=None
            )
            channel.send(PublishedBatch((Published.of(1, now_result, tail),)))
            sent += 1
            n += 1
        control.send(n)


def _scraper(url: str, every_s: float, out: Connection) -> None:
    """GET /metrics every `every_s` seconds, as Prometheus does, until told to stop; send back
    (start, seconds) of each scrape."""
    import urllib.request

    scrapes: list[tuple[float, float]] = []
    while not out.poll(every_s):
        start = time.time()
        with urllib.request.urlopen(url, timeout=30) as response:
            response.read()
        scrapes.append((start, time.time() - start))
    out.recv()
    out.send(scrapes)


def _client(url: str, out: Connection) -> None:
    """Read /v1/events until the server shuts down, resuming after a `lagging` goodbye as a
    client should (`?after=`); send back (receive time, latency) of every result and the
    goodbyes (receive time, type)."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    samples: list[tuple[float, float]] = []
    others: list[tuple[float, str]] = []  # a goodbye (lagging) before the end is a finding
    target = url
    connected = False
    while True:
        kind = "closed"
        try:
            with connect(target, max_size=None) as ws:
                if not connected:
                    out.send("connected")
                    connected = True
                for text in ws:
                    now = time.time()
                    event = json.loads(text)
                    if event["type"] == "result":
                        samples.append((now, now - event["result"]["published_time"]))
                    else:
                        kind = event["type"]
                        others.append((now, kind))
                        if kind == "lagging":
                            target = f"{url}?after={event['resume_after']}"
        except (ConnectionClosed, OSError):
            pass
        if kind != "lagging":
            break
    out.send((samples, others))
    out.close()


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    return {
        "mean_ms": statistics.fmean(ordered) * 1000,
        "p50_ms": at(0.5),
        "p90_ms": at(0.9),
        "p99_ms": at(0.99),
        "max_ms": ordered[-1] * 1000,
        "n": len(ordered),
    }


UNBOUNDED = 1 << 30
VARIANTS: dict[str, dict[str, Any]] = {
    "unbounded": {"batch": UNBOUNDED, "switch_interval_s": None},
    "batch64": {"batch": 64, "switch_interval_s": None},
    "switch1ms": {"batch": UNBOUNDED, "switch_interval_s": 0.001},
    "both": {"batch": 64, "switch_interval_s": 0.001},
}


def _apply(variant: dict[str, Any], default_switch: float, default_batch: int) -> None:
    from vdet.results import hub

    hub._Outbox.batch = variant.get("batch", default_batch)
    switch = variant.get("switch_interval_s")
    sys.setswitchinterval(default_switch if switch is None else switch)


def main() -> None:
    import socket

    import uvicorn

    from vdet.api.app import create_app
    from vdet.api.server import server_config
    from vdet.config.settings import Settings
    from vdet.config.workers import WorkerSettings
    from vdet.core.types import SourceState
    from vdet.workers.channel import PublishedBatch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[1000.0, 2000.0])
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=12.0, help="per window")
    parser.add_argument("--warmup", type=float, default=2.0, help="left out of each window")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument(
        "--readers",
        choices=["loop", "thread", "per-pipe"],
        default="loop",
        help="the pipes read on the event loop (vdet serve), on one thread, or a thread each",
    )
    parser.add_argument(
        "--scrape-every",
        type=float,
        default=0.0,
        help="GET /metrics this often (seconds) from a process of its own, and report the "
        "latency of results received in the second after each scrape began apart (0: never)",
    )
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--profile-out",
        type=Path,
        help="cProfile the event-loop thread over all windows into this pstats file (skews "
        "the timings: a run of its own, one variant)",
    )
    args = parser.parse_args()

    ctx = multiprocessing.get_context("spawn")
    assets = Path(__file__).resolve().parent.parent / "service" / "vdet" / "assets"
    settings = Settings(
        model_path=assets / "demo.onnx", backend="onnxruntime", workers=WorkerSettings(processes=0)
    )
    app = create_app(settings, freeze_startup_objects=True)
    runtime = app.state.service
    lags: list[tuple[float, float]] = []
    observe_lag = runtime.metrics.observe_loop_lag

    def record_lag(seconds: float) -> None:
        lags.append((time.time(), seconds))
        observe_lag(seconds)

    runtime.metrics.observe_loop_lag = record_lag
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = server_config(app, port=port)  # as `vdet serve` runs it
    server = uvicorn.Server(config)

    def read(conn: Connection) -> None:  # WorkerPool._read's path for a result
        from vdet.workers.channel import Channel

        channel = Channel(conn)
        hub, metrics = runtime.hub, runtime.metrics
        while True:
            try:
                message = channel.recv()
            except (EOFError, OSError):
                return
            if isinstance(message, PublishedBatch):
                for result in message.results:
                    hub.publish_encoded(result.source_id, result.frame_index, result.encoded_tail)
                    metrics.observe(result.observed)

    def publish(message: object) -> None:  # WorkerPool._on_message's path for a result
        if isinstance(message, PublishedBatch):
            for result in message.results:
                runtime.hub.publish_encoded(
                    result.source_id, result.frame_index, result.encoded_tail
                )
                runtime.metrics.observe(result.observed)

    producers = []
    pipes = []
    for index in range(args.producers):
        ours, theirs = ctx.Pipe(duplex=True)
        control_ours, control_theirs = ctx.Pipe(duplex=True)
        process = ctx.Process(target=_produce, args=(index, theirs, control_theirs), daemon=True)
        process.start()
        theirs.close()
        control_theirs.close()
        if args.readers == "per-pipe":
            threading.Thread(target=read, args=(ours,), name=f"reader-{index}", daemon=True).start()
        pipes.append(ours)
        producers.append((process, control_ours))

    def read_with_inbox(loop: asyncio.AbstractEventLoop | None) -> None:
        from vdet.workers.channel import Channel
        from vdet.workers.inbox import Inbox

        inbox = Inbox(loop)
        for conn in pipes:
            inbox.add(Channel(conn), publish, lambda: None)

    if args.readers == "thread":
        read_with_inbox(None)
    clients = []
    for _ in range(args.clients):
        ours, theirs = ctx.Pipe(duplex=False)
        url = f"ws://127.0.0.1:{port}/v1/events"
        process = ctx.Process(target=_client, args=(url, theirs), daemon=True)
        clients.append((process, ours, theirs))

    scraper = None
    if args.scrape_every > 0:
        scraper_ours, scraper_theirs = ctx.Pipe(duplex=True)
        scraper = ctx.Process(
            target=_scraper,
            args=(f"http://127.0.0.1:{port}/metrics", args.scrape_every, scraper_theirs),
            daemon=True,
        )
    windows: list[dict[str, Any]] = []
    default_switch = sys.getswitchinterval()
    from vdet.results import hub

    default_batch = hub._Outbox.batch

    async def orchestrate() -> None:
        loop = asyncio.get_running_loop()
        while not server.started:
            await asyncio.sleep(0.05)
        if args.readers == "loop":
            read_with_inbox(loop)
        for _, control in producers:
            assert await loop.run_in_executor(None, control.recv) == "ready"
        for sid in range(SOURCES):
            runtime.metrics.add_source(f"cam{sid}", SourceState.STREAMING)
        for process, ours, theirs in clients:
            process.start()
            theirs.close()
            assert await loop.run_in_executor(None, ours.recv) == "connected"
        if scraper is not None:
            scraper.start()
        profiler = cProfile.Profile() if args.profile_out else None
        if profiler is not None:
            profiler.enable()  # this thread only: the loop's
        for round_ in range(args.rounds):
            for rate in args.rates:
                for name in args.variants:
                    _apply(VARIANTS[name], default_switch, default_batch)
                    start = time.time()
                    until = start + args.seconds
                    cpu = time.process_time()
                    for _, control in producers:
                        control.send((rate / args.producers, until))
                    sent = 0
                    for _, control in producers:
                        sent += await loop.run_in_executor(None, control.recv)
                    cpu = time.process_time() - cpu
                    windows.append(
                        {
                            "round": round_,
                            "rate": rate,
                            "variant": name,
                            "from": start + args.warmup,
                            "to": until,
                            "sent_per_s": sent / args.seconds,
                            "api_cpu_cores": cpu / (time.time() - start),
                            "load_1m": os.getloadavg()[0],
                        }
                    )
                    print(round_, rate, name, f"sent {sent / args.seconds:.0f}/s", flush=True)
                    await asyncio.sleep(1.0)  # the tail drains before the next window
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile_out)
        _apply({}, default_switch, default_batch)
        if scraper is not None:
            scraper_ours.send(None)
            scrapes.extend(await loop.run_in_executor(None, scraper_ours.recv))
        for _, control in producers:
            control.send(None)
        server.should_exit = True

    scrapes: list[tuple[float, float]] = []

    async def run() -> None:
        task = asyncio.create_task(orchestrate())
        await server.serve()
        await task

    asyncio.run(run())
    received = [ours.recv() for _, ours, _ in clients]
    samples = [per for per, _ in received]
    goodbyes = [other for _, others in received for other in others]
    for process, _, _ in clients:
        process.join(10)
    rows = []
    for w in windows:
        inside = [latency for per in samples for at, latency in per if w["from"] <= at <= w["to"]]
        after_scrape = [
            latency
            for per in samples
            for at, latency in per
            if w["from"] <= at <= w["to"] and any(0 <= at - s < 1.0 for s, _ in scrapes)
        ]
        others = [
            latency
            for per in samples
            for at, latency in per
            if w["from"] <= at <= w["to"] and not any(0 <= at - s < 1.0 for s, _ in scrapes)
        ]
        lag = [s for at, s in lags if w["from"] <= at <= w["to"]]
        row = {
            **{k: v for k, v in w.items() if k not in ("from", "to")},
            "latency": _percentiles(inside),
            "loop_lag": _percentiles(lag),
            "latency_in_the_second_after_a_scrape": _percentiles(after_scrape),
            "latency_other_seconds": _percentiles(others),
            "scrape_seconds": [d for s, d in scrapes if w["from"] <= s <= w["to"]],
            "goodbyes": [kind for at, kind in goodbyes if w["from"] - args.warmup <= at <= w["to"]],
        }
        rows.append(row)
    summary: dict[str, dict[str, dict[str, float]]] = {}
    for rate in args.rates:
        for name in args.variants:
            mine = [r for r in rows if r["rate"] == rate and r["variant"] == name]
            summary.setdefault(str(int(rate)), {})[name] = {
                f"{part}_{key}": statistics.median(r[part].get(key, float("nan")) for r in mine)
                for part in ("latency", "loop_lag")
                for key in ("mean_ms", "p50_ms", "p99_ms", "max_ms")
            } | {"api_cpu_cores": statistics.median(r["api_cpu_cores"] for r in mine)}
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "python": sys.version,
        },
        "producers": args.producers,
        "readers": args.readers,
        "clients": args.clients,
        "seconds": args.seconds,
        "warmup": args.warmup,
        "windows": rows,
        "median_over_rounds": summary,
    }
    print(json.dumps(summary, indent=1))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
