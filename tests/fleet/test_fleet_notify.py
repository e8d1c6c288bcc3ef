"""Webhooks of a fleet deliver each zone event once, whichever node fetched it (a JetStream
consumer the nodes share, vdet.fleet.notifications): two real `vdet serve` nodes with the same
`notify` settings, one webhook receiver, a real NATS server."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from support.apptest import CLIP_WH, write_tiny_model
from support.nats_servers import nats_server_binary, single_server
from support.serve import start_service
from support.videos import write_h264_clip
from support.waiting import wait_until
from support.webhooks import Receiver

pytestmark = pytest.mark.slow


def test_each_event_reaches_the_webhook_once_from_a_fleet(tmp_path: Path) -> None:
    nats_server_binary()
    server = single_server(tmp_path / "nats")
    model = write_tiny_model(tmp_path / "tiny.onnx")
    clip = write_h264_clip(tmp_path / "clip.mp4", seconds=2.0, fps=15, size_wh=CLIP_WH)
    receiver = Receiver()
    # The tiny model's fixed boxes become tracks inside a zone over the whole frame.
    zone = {"id": "all", "kind": "polygon", "points": [[0, 0], [1, 0], [1, 1], [0, 1]]}
    sources = [
        {"id": f"gate{i}", "url": str(clip), "loop": True, "realtime": True, "zones": [zone]}
        for i in range(4)
    ]
    nodes = []
    try:
        for name in ("a", "b"):
            nodes.append(
                start_service(
                    tmp_path,
                    model,
                    cluster={"servers": [server.url], "node_id": name, "lease_s": 2.0},
                    notify={"webhooks": [{"id": "ops", "url": receiver.url}]},
                    sources=sources,
                )
            )
        wait_until(
            lambda: (
                {s["id"] for s in nodes[0].get("/v1/streams")[1]["streams"]}
                == {f"gate{i}" for i in range(4)}
            ),
            30,
            what="four streams in the fleet",
        )

        def entered() -> set[str]:
            return {
                b["source_id"]
                for b in receiver.bodies()
                if any(e["type"] == "zone_enter" for e in b["events"])
            }

        wait_until(lambda: len(entered()) == 4, 60, what="every stream's zone_enter delivered")
        bodies = receiver.bodies()
        # Each delivery is one result's events, and no result was delivered twice.
        times = Counter((b["source_id"], b["seq"]) for b in bodies)
        assert max(times.values()) == 1, [k for k, n in times.items() if n > 1]
        enters = Counter(
            b["source_id"] for b in bodies for e in b["events"] if e["type"] == "zone_enter"
        )
        # One zone_enter per track: the tiny model's boxes make the same tracks on every
        # stream, so every stream has as many as the first.
        assert len(set(enters.values())) == 1, enters
        # The deliveries were shared: the consumer hands results to both nodes.
        sent = [n.metrics() for n in nodes]
        delivered = (
            "vdet_webhook_deliveries_total",
            (("outcome", "delivered"), ("webhook", "ops")),
        )
        counts = [m.get(delivered, 0) for m in sent]
        assert sum(counts) == len(bodies), (counts, len(bodies))
        # Both nodes keep up with the shared consumer: its backlog is a few results at most
        # (the streams are realtime; each fetch takes what is there).
        backlog = [m[("vdet_fleet_notify_pending", ())] for m in sent]
        assert all(0 <= n < 100 for n in backlog), backlog
        print(f"deliveries by node: {counts}; zone_enter per stream: {dict(enters)}")
        status, body = nodes[1].get("/v1/nodes")
        assert status == 200 and body["unowned"] == [], body
    finally:
        for svc in nodes:
            svc.process.stop()
        receiver.close()
        server.stop()
