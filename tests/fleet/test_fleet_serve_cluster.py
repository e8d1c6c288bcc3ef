"""Two real `vdet serve` nodes on a real three-server NATS JetStream cluster (buckets and results
with 3 replicas), one stream a live RTSP camera (GStreamer's RTSP server) and one a file: a NATS
server killed under them, and the fleet going on. Every stream keeps running on exactly one
node, publishes on, is read through either node, and a client that read up to a seq on one
node resumes on the other with no gap and no duplicate, across the server's death."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.apptest import CLIP_WH, write_tiny_model
from support.nats_servers import cluster, nats_server_binary
from support.rtsp import RtspServer
from support.serve import Service, start_service
from support.videos import write_h264_clip
from support.waiting import wait_until
from websockets.sync.client import connect

pytestmark = pytest.mark.slow

LEASE_S = 4.0


def placement(svc: Service) -> dict[str, str]:
    status, body = svc.get("/v1/nodes")
    assert status == 200, body
    return {s: n["id"] for n in body["nodes"] for s in n["streams"]}


def results_until(
    url: str, done: Callable[[list[dict[str, Any]]], bool], timeout: float = 90
) -> list[dict[str, Any]]:
    """The result messages of a WebSocket feed until `done(results so far)`."""
    out: list[dict[str, Any]] = []
    with connect(url, open_timeout=10) as ws:
        deadline = time.monotonic() + timeout
        while not done(out):
            message = json.loads(ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if message["type"] == "result":
                out.append(message["result"])
    return out


def streaming(svc: Service, stream_id: str) -> bool:
    status, one = svc.get(f"/v1/streams/{stream_id}")
    return status == 200 and one["status"]["state"] == "streaming"


def test_a_fleet_on_a_nats_cluster_goes_on_when_a_server_dies(
    tmp_path: Path, rtsp_server_factory: Any
) -> None:
    nats_server_binary()
    servers = cluster(tmp_path / "nats")
    model = write_tiny_model(tmp_path / "tiny.onnx")
    clip = write_h264_clip(tmp_path / "clip.mp4", seconds=2.0, fps=15, size_wh=CLIP_WH)
    camera: RtspServer = rtsp_server_factory(clip)
    sources = [
        {"id": "door", "url": camera.url},
        {"id": "yard", "url": str(clip), "loop": True, "realtime": True},
    ]
    nodes: dict[str, Service] = {}
    try:
        for name in ("a", "b"):
            nodes[name] = start_service(
                tmp_path,
                model,
                cluster={
                    # Each node knows every server and starts on a different one.
                    "servers": [s.url for s in servers[ord(name) - ord("a") :] + servers],
                    "node_id": name,
                    "capacity": 2,
                    "lease_s": LEASE_S,
                    "replicas": 3,
                    "prefix": "c",
                },
                sources=sources,
            )
        a, b = nodes["a"], nodes["b"]
        wait_until(lambda: len(placement(a)) == 2, 60, what="both streams placed")
        for svc in (a, b):
            for stream_id in ("door", "yard"):
                wait_until(
                    lambda svc=svc, s=stream_id: streaming(svc, s),
                    60,
                    what=f"{stream_id} streaming, read through {svc.base}",
                )
        before = results_until(
            f"{a.ws_base}/v1/events", lambda got: {r["source_id"] for r in got} >= {"door", "yard"}
        )
        last = before[-1]["seq"]

        servers[0].kill()  # the first server of node a's list
        killed_at, killed_wall = time.monotonic(), time.time()
        # The fleet goes on: every stream runs on exactly one node and publishes again; a
        # stream whose lease renewal fell into a bucket's leader election may have been fenced
        # and claimed again meanwhile.
        wait_until(
            lambda: sorted(placement(a)) == ["door", "yard"] and placement(a) == placement(b),
            60,
            what="both streams placed, seen alike by both nodes",
        )

        def both_fresh(got: list[dict[str, Any]]) -> bool:
            # Both streams publishing again: results of frames read after the server died.
            fresh = {r["source_id"] for r in got if r["arrival_time"] > killed_wall + 1}
            return fresh >= {"door", "yard"}

        after = results_until(f"{b.ws_base}/v1/events?after={last}", both_fresh)
        seqs = [r["seq"] for r in after]
        # Resumed on the other node across the server's death: no gap, no duplicate.
        assert seqs == list(range(last + 1, last + 1 + len(seqs))), seqs[:10]
        for svc in (a, b):
            for stream_id in ("door", "yard"):
                wait_until(
                    lambda svc=svc, s=stream_id: streaming(svc, s),
                    60,
                    what=f"{stream_id} read through {svc.base} after the server died",
                )
        status, body = a.get("/v1/nodes")
        assert status == 200 and body["unowned"] == [] and len(body["nodes"]) == 2, body
        print(f"fleet whole again {time.monotonic() - killed_at:.1f} s after a server died")
    finally:
        for svc in nodes.values():
            svc.process.stop()
        for server in servers:
            server.stop()
