"""Three real `vdet serve` nodes on a real three-server NATS JetStream cluster (buckets and
results with 3 replicas), one stream a live RTSP camera (GStreamer's RTSP server), two files:
a NATS server killed under them, and the fleet going on (every stream on exactly one node,
publishing on, read through any node, a client resuming on another node with no gap and no
duplicate across the server's death); then the camera's node paused with SIGSTOP past its
lease: the camera runs on another node, and the paused node, resumed, fences itself (it
publishes nothing more for it) instead of running it twice."""

from __future__ import annotations

import json
import os
import signal
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


def read_everywhere(nodes: dict[str, Service], streams: list[str], when: str) -> None:
    """Every stream streaming, as each node shows it."""
    for svc in nodes.values():
        for stream_id in streams:
            wait_until(
                lambda svc=svc, s=stream_id: streaming(svc, s),
                60,
                what=f"{stream_id} streaming, read through {svc.base} {when}",
            )


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
        {"id": "gate", "url": str(clip), "loop": True, "realtime": True},
    ]
    streams = sorted(s["id"] for s in sources)
    nodes: dict[str, Service] = {}
    try:
        for i, name in enumerate(("a", "b", "c")):
            nodes[name] = start_service(
                tmp_path,
                model,
                cluster={
                    # Each node knows every server and starts on a different one.
                    "servers": [s.url for s in servers[i:] + servers[:i]],
                    "node_id": name,
                    "capacity": 2,
                    "lease_s": LEASE_S,
                    "replicas": 3,
                    "prefix": "c",
                },
                sources=sources,
            )
        a, b = nodes["a"], nodes["b"]
        wait_until(lambda: len(placement(a)) == 3, 60, what="every stream placed")
        read_everywhere(nodes, streams, "at the start")
        before = results_until(
            f"{a.ws_base}/v1/events", lambda got: {r["source_id"] for r in got} >= set(streams)
        )
        last = before[-1]["seq"]

        servers[0].kill()  # the first server of node a's list
        killed_at, killed_wall = time.monotonic(), time.time()
        # The fleet goes on: every stream runs on exactly one node and publishes again; a
        # stream whose lease renewal fell into a bucket's leader election may have been fenced
        # and claimed again meanwhile.
        wait_until(
            lambda: sorted(placement(a)) == streams and placement(a) == placement(b),
            60,
            what="every stream placed, seen alike by the nodes",
        )

        def all_fresh(got: list[dict[str, Any]]) -> bool:
            # Both streams publishing again: results of frames read after the server died.
            fresh = {r["source_id"] for r in got if r["arrival_time"] > killed_wall + 1}
            return fresh >= set(streams)

        after = results_until(f"{b.ws_base}/v1/events?after={last}", all_fresh)
        seqs = [r["seq"] for r in after]
        # Resumed on the other node across the server's death: no gap, no duplicate.
        assert seqs == list(range(last + 1, last + 1 + len(seqs))), seqs[:10]
        read_everywhere(nodes, streams, "after the server died")

        def whole() -> bool:  # every node seen again by a (its watchers may restart)
            status, body = a.get("/v1/nodes")
            return status == 200 and body["unowned"] == [] and len(body["nodes"]) == 3

        wait_until(whole, 30, what="node a seeing the whole fleet again")
        print(f"fleet whole again {time.monotonic() - killed_at:.1f} s after a server died")

        # The camera's node paused past its lease: another node runs the camera; resumed, the
        # paused node finds its lease stale and stops the camera itself (fencing).
        owner = placement(a)["door"]
        paused = nodes[owner]
        watcher = next(svc for name, svc in nodes.items() if name != owner)
        os.kill(paused.process.popen.pid, signal.SIGSTOP)
        try:
            wait_until(
                lambda: placement(watcher).get("door") not in (None, owner),
                LEASE_S + 30,
                what="the camera claimed off the paused node",
            )
        finally:
            os.kill(paused.process.popen.pid, signal.SIGCONT)
        fenced = ("vdet_fleet_lease_events_total", (("event", "fenced"),))
        wait_until(
            lambda: paused.metrics().get(fenced, 0) >= 1,
            20,
            what="the resumed node fencing itself",
        )
        moved_to = placement(watcher)["door"]
        wait_until(
            lambda: placement(paused).get("door") == moved_to,
            20,
            what="the resumed node seeing the camera where it now runs",
        )
        status, one = paused.get("/v1/streams/door")
        assert status == 200 and one["node"] == moved_to, one
        # Its feed, read from after the pause: the camera's frames from one node only (one
        # frame sequence, increasing), every seq once.
        mark = results_until(f"{watcher.ws_base}/v1/events", lambda got: len(got) >= 1)[-1]["seq"]
        door = [
            r
            for r in results_until(
                f"{watcher.ws_base}/v1/events?after={mark}",
                lambda got: sum(r["source_id"] == "door" for r in got) >= 30,
            )
            if r["source_id"] == "door"
        ]
        frames = [r["frame_index"] for r in door]
        assert frames == sorted(frames) and len(set(frames)) == len(frames), frames
    finally:
        for svc in nodes.values():
            svc.process.stop()
        for server in servers:
            server.stop()
