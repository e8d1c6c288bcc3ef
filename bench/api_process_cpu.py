"""What each result costs the API process of `vdet serve` between its worker pipe and its
WebSocket clients, for the results hub of this checkout against the hub of an earlier commit.

No server, no worker: results shaped like a 1080p stream's (10 detections, encoded by the
worker code path `encode_result_tail`) go through a pickle round trip (what the pipe reader
thread does), then a `ResultsHub` (capacity as configured by default), then out to 4
all-streams subscribers on an asyncio loop, each looking up the message text as
/v1/events does. Measured per variant, alternately (the machine may be shared: compare the
ratios of one run):

- tracked: objects the garbage collector tracks per kept result, with the replay ring full;
- gen-2 ms: one full collection with the ring full (median of several), and with no hub;
  last, this checkout's hub again after `gc.freeze()` of everything imported (as `vdet serve`
  does once started): what a full collection then costs;
- publish + fan-out us: CPU time per result for publish, delivery to 4 subscribers and their
  message text, collections included (they are part of the steady state);
- unpickle us: the reader thread's `pickle.loads` of one (handle, result) message, with numpy's
  own array pickling (as before `Detections.__reduce__`) and with this checkout's;
- send us: CPU of the server process per WebSocket message that a FastAPI route under uvicorn
  (the settings `vdet serve` uses) sends, with the per-message timer /v1/events arms; the
  reading client is another process.

    .venv/bin/python bench/api_process_cpu.py --baseline f4537a8 --out result.json
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import importlib.util
import json
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import uvicorn
from fastapi import FastAPI, WebSocket

from vdet.api.server import server_config
from vdet.bench.environment import environment
from vdet.core.types import DetectionResult, Detections, StageTimings
from vdet.results.hub import ResultsHub
from vdet.results.wire import ResultEventEncoder, encode_result_tail

SOURCES = 64
DETECTIONS = 10
SUBSCRIBERS = 4
NAMES = tuple(f"class{i}" for i in range(80))


def baseline_hub_module(ref: str) -> ModuleType:
    """`vdet.results.hub` as it was at git `ref`, loaded beside this checkout's."""
    repo = Path(__file__).resolve().parent.parent
    # The module's file since the src layout, and before it.
    for where in ("service/vdet/results/hub.py", "service/hub.py"):
        shown = subprocess.run(
            ["git", "-C", str(repo), "show", f"{ref}:{where}"],
            check=False,
            capture_output=True,
            text=True,
        )
        if shown.returncode == 0:
            source = shown.stdout
            break
    else:
        raise SystemExit(f"no vdet hub module at git ref {ref!r}: {shown.stderr.strip()}")
    path = Path(tempfile.mkdtemp()) / "baseline_hub.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("baseline_hub", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["baseline_hub"] = module
    spec.loader.exec_module(module)
    return module


def wire_messages(count: int) -> list[bytes]:
    """`count` pickled result messages as a worker sent them before `Published`."""
    rng = np.random.default_rng(0)
    out = []
    for i in range(count):
        xy = rng.uniform(0, 1000, (DETECTIONS, 2)).astype(np.float32)
        dets = Detections(
            np.concatenate([xy, xy + 50], axis=1),
            rng.uniform(0.3, 1, DETECTIONS).astype(np.float32),
            rng.integers(0, 80, DETECTIONS).astype(np.int32),
        )
        now = time.time()
        result = DetectionResult(
            f"cam{i % SOURCES}",
            i // SOURCES,
            i / 30,
            now,
            now,
            (1920, 1080),
            dets,
            StageTimings(0.001, 0.002, 0.003, 0.001, 0.01),
        )
        tail = encode_result_tail(result, NAMES)
        # The pipe's result message of the time, (handle, result); now `Published`, which
        # carries the result pickled inside (vdet.workers.channel).
        message = (1, dataclasses.replace(result, encoded_tail=tail))
        out.append(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
    return out


def fill(hub_type: Any, messages: list[bytes], count: int) -> Any:
    hub = hub_type()
    for i in range(count):
        hub.publish(pickle.loads(messages[i % len(messages)])[1])
    return hub


def tracked_and_pauses(hub_type: Any, messages: list[bytes], kept: int) -> dict[str, float]:
    gc.collect()
    before = len(gc.get_objects())
    hub = fill(hub_type, messages, kept + 4096)
    gc.collect()
    tracked = (len(gc.get_objects()) - before) / kept
    pauses = []
    for _ in range(5):
        t = time.perf_counter()
        gc.collect(2)
        pauses.append(time.perf_counter() - t)
    del hub
    return {"tracked_per_result": tracked, "gen2_ms": statistics.median(pauses) * 1000}


async def _fan_out(hub: Any, results: list[DetectionResult], encoder: ResultEventEncoder) -> float:
    subs = [hub.subscribe() for _ in range(SUBSCRIBERS)]
    total = 0
    start = time.process_time()
    for first in range(0, len(results), 128):
        for result in results[first : first + 128]:
            hub.publish(result)
        await asyncio.sleep(0)  # the outbox delivers the burst
        for sub in subs:
            while sub._items:
                item = await sub.get()
                total += len(encoder.encode(item, NAMES))
    spent = time.process_time() - start
    for sub in subs:
        sub.close()
    assert total > 0
    return spent / len(results)


def fan_out_cost(hub_type: Any, messages: list[bytes], kept: int, count: int) -> float:
    """CPU seconds per result, with the hub's rings already full (the steady state)."""
    hub = fill(hub_type, messages, kept)
    results = [pickle.loads(messages[i % len(messages)])[1] for i in range(count)]
    cost = asyncio.run(_fan_out(hub, results, ResultEventEncoder()))
    del hub, results
    return cost


def unpickle_cost(messages: list[bytes]) -> float:
    start = time.process_time()
    for data in messages:
        pickle.loads(data)
    return (time.process_time() - start) / len(messages)


def numpy_pickled(messages: list[bytes]) -> list[bytes]:
    """The same messages as numpy pickles arrays by itself (`Detections` without its own
    `__reduce__`)."""
    objects = [pickle.loads(m) for m in messages]
    reduce = Detections.__reduce__
    del Detections.__reduce__
    try:
        return [pickle.dumps(o, protocol=pickle.HIGHEST_PROTOCOL) for o in objects]
    finally:
        Detections.__reduce__ = reduce  # type: ignore[method-assign]


def _read_all(url: str, count: int) -> None:
    from websockets.sync.client import connect

    with connect(url, max_size=None) as ws:
        for _ in range(count):
            ws.recv()


def send_cost(text: str, count: int) -> float:
    """Server CPU seconds per WebSocket message (client in another process)."""
    import multiprocessing
    import socket

    app = FastAPI()
    spent: list[float] = []

    @app.websocket("/feed")
    async def feed(ws: WebSocket) -> None:
        await ws.accept()
        loop = asyncio.get_running_loop()
        start = time.process_time()
        for _ in range(count):
            timer = loop.call_later(10.0, lambda: None)  # as /v1/events's send timeout
            try:
                await ws.send_text(text)
            finally:
                timer.cancel()
        spent.append(time.process_time() - start)
        await ws.close()

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = server_config(app, port=port)  # as `vdet serve` runs it
    server = uvicorn.Server(config)
    client = multiprocessing.get_context("spawn").Process(
        target=_read_all, args=(f"ws://127.0.0.1:{port}/feed", count)
    )

    async def run() -> None:
        serving = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.01)
        client.start()
        while not spent:
            if not client.is_alive() and client.exitcode is not None:
                server.should_exit = True
                await serving
                raise RuntimeError(f"the reading client exited with {client.exitcode}")
            await asyncio.sleep(0.05)
        server.should_exit = True
        await serving

    asyncio.run(run())
    client.join(30)
    return spent[0] / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, help="git ref of the hub to compare with")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--results", type=int, default=20000, help="per fan-out measurement")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    baseline = baseline_hub_module(args.baseline)
    variants = {"baseline": baseline.ResultsHub, "this": ResultsHub}
    kept = 16384  # hub.capacity_total's default
    messages = wire_messages(4096)
    gc.collect()
    t = time.perf_counter()
    gc.collect(2)
    no_hub_ms = (time.perf_counter() - t) * 1000
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    for round_ in range(args.rounds):
        for name, hub_type in variants.items():
            row = tracked_and_pauses(hub_type, messages, kept)
            row["fan_out_us"] = fan_out_cost(hub_type, messages, kept, args.results) * 1e6
            rows[name].append(row)
            print(round_, name, {k: round(v, 2) for k, v in row.items()}, flush=True)
    gc.collect()
    gc.freeze()
    frozen = tracked_and_pauses(ResultsHub, messages, kept)
    gc.unfreeze()
    baseline_messages = numpy_pickled(messages)
    unpickled: dict[str, list[float]] = {"baseline": [], "this": []}
    for _ in range(2 * args.rounds + 1):  # alternately
        unpickled["baseline"].append(unpickle_cost(baseline_messages) * 1e6)
        unpickled["this"].append(unpickle_cost(messages) * 1e6)
    unpickle_us = {name: statistics.median(runs) for name, runs in unpickled.items()}
    text = ResultEventEncoder().encode(pickle.loads(messages[0]).result, NAMES)
    send_us = statistics.median(send_cost(text, args.results) for _ in range(args.rounds)) * 1e6
    summary = {
        name: {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        for name, runs in rows.items()
    }
    ratios = {
        key: summary["this"][key] / summary["baseline"][key]
        for key in summary["this"]
        if summary["baseline"][key]
    }
    ratios["unpickle_us"] = unpickle_us["this"] / unpickle_us["baseline"]
    report = {
        "environment": environment(),
        "baseline_ref": args.baseline,
        "kept_results": kept,
        "sources": SOURCES,
        "subscribers": SUBSCRIBERS,
        "message_bytes": statistics.median(len(m) for m in messages),
        "gen2_ms_no_hub": no_hub_ms,
        "gen2_ms_this_after_freeze": frozen["gen2_ms"],
        "unpickle_us": unpickle_us,
        "send_us": send_us,
        "rounds": rows,
        "median": summary,
        "ratio_this_over_baseline": ratios,
    }
    shown = {"median": summary, "ratios": ratios, "unpickle_us": unpickle_us, "send_us": send_us}
    extra = {"gen2_ms_no_hub": no_hub_ms, "gen2_ms_this_after_freeze": frozen["gen2_ms"]}
    print(json.dumps({**shown, **extra}, indent=1))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
