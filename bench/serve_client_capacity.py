"""How many results per second one `vdet bench serve` WebSocket client process takes, and at what
CPU, so that a run's figures are known not to be the client's limit.

A local websockets server (no vdet server) sends results shaped like /v1/events's (10
detections each, about 1.1 KB) at a fixed rate to one `EventsClient` process for a window:

    python bench/serve_client_capacity.py 2000 3000
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import sys
import time

from websockets.asyncio.server import ServerConnection, serve

from vdet.bench.serve.events_client import client_main

WINDOW_S = 4.0
DETECTION = {"class": "car", "class_id": 2, "score": 0.91, "box": [100.5, 200.25, 300.0, 400.75]}


def _result(seq: int, now: float) -> str:
    result = {
        "seq": seq,
        "source_id": f"n64-{seq % 64}",
        "frame_index": seq // 64,
        "pts_s": 1.0,
        "arrival_time": now - 0.005,
        "published_time": now - 0.001,
        "image_width": 1920,
        "image_height": 1080,
        "detections": [DETECTION] * 10,
        "timings_ms": {"preprocess": 0.1, "inference": 1.2, "postprocess": 0.2},
    }
    return json.dumps({"type": "result", "result": result})


async def _measure(rate: float) -> dict[str, object]:
    async def send(ws: ServerConnection) -> None:
        seq, start = 0, time.time()
        while time.time() - start < WINDOW_S + 4:
            while seq < int((time.time() - start) * rate):
                seq += 1
                await ws.send(_result(seq, time.time()))
            await asyncio.sleep(0.002)

    async with serve(send, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        process = ctx.Process(target=client_main, args=(f"ws://127.0.0.1:{port}", child))
        process.start()
        await asyncio.to_thread(parent.recv)
        start = time.time() + 1.0
        parent.send(("window", start, start + WINDOW_S, "n64-"))
        await asyncio.sleep(WINDOW_S + 1.5)
        parent.send(("collect",))
        _, figures = await asyncio.to_thread(parent.recv)
        parent.send(("stop",))
        process.join(5)
    latency = figures["latency_ms"]
    return {
        "sent_per_s": rate,
        "received_per_s": figures["results_per_s"],
        "client_cpu_percent": figures["cpu_percent"],
        "latency_p50_ms": latency["p50"] if latency else None,
        "latency_p99_ms": latency["p99"] if latency else None,
        "message_bytes": len(_result(1, 0.0)),
    }


if __name__ == "__main__":
    for arg in sys.argv[1:] or ["2000"]:
        print(json.dumps(asyncio.run(_measure(float(arg)))))
