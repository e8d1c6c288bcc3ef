"""What the API does to a fleet's streams outlives its nodes: two real `vdet serve` nodes on a
real NATS server change streams and zones through each other, are stopped together and started
again with the same config, and every stream, change, zone and removal is as it was."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.apptest import CLIP_WH, write_tiny_model
from support.nats_servers import nats_server_binary, single_server
from support.serve import Service, start_service
from support.videos import write_h264_clip
from support.waiting import wait_until

pytestmark = pytest.mark.slow

# Over the whole frame: the tiny model's fixed boxes become tracks inside it.
DOOR = {"kind": "polygon", "points": [[0, 0], [1, 0], [1, 1], [0, 1]]}


def _streams(svc: Service) -> dict[str, dict[str, Any]]:
    status, body = svc.get("/v1/streams")
    assert status == 200, body
    return {s["id"]: s for s in body["streams"]}


def _owner(svc: Service, stream_id: str) -> str | None:
    status, body = svc.get("/v1/nodes")
    assert status == 200
    return next((n["id"] for n in body["nodes"] if stream_id in n["streams"]), None)


def test_streams_changes_and_zones_outlive_a_restart_of_every_node(tmp_path: Path) -> None:
    nats_server_binary()
    server = single_server(tmp_path / "nats")
    model = write_tiny_model(tmp_path / "tiny.onnx")
    clip = write_h264_clip(tmp_path / "clip.mp4", seconds=2.0, fps=15, size_wh=CLIP_WH)
    sources = [
        {"id": sid, "url": str(clip), "loop": True, "realtime": True} for sid in ("cam1", "old")
    ]

    def start(name: str) -> Service:
        cluster = {"servers": [server.url], "node_id": name, "lease_s": 2.0, "capacity": 2}
        return start_service(tmp_path, model, cluster=cluster, sources=sources)

    nodes: list[Service] = []
    try:
        nodes = [start("a"), start("b")]
        a, b = nodes
        body = {"id": "cam2", "url": str(clip), "loop": True, "realtime": True}
        assert a.send("POST", "/v1/streams", body)[0] == 201
        wait_until(lambda: _owner(a, "cam2") is not None, 30, what="cam2 placed")
        # Each change through the node that does not run the stream.
        other = {"a": b, "b": a}
        via = other[_owner(a, "cam2") or "a"]
        status, zone = via.send("PUT", "/v1/streams/cam2/zones/door", DOOR)
        assert status == 201, zone
        status, zones = other["a" if via is a else "b"].get("/v1/streams/cam2/zones")
        assert status == 200 and [z["id"] for z in zones["zones"]] == ["door"]
        # The counts live on the node that runs the stream: asked of it.
        wait_until(
            lambda: "door" in (via.get("/v1/streams/cam2/counts")[1] or {}).get("objects", {}),
            30,
            what="the zone's counts through the other node",
        )
        wait_until(lambda: _owner(a, "cam1") is not None, 30, what="cam1 placed")
        via = other[_owner(a, "cam1") or "a"]
        assert via.send("PATCH", "/v1/streams/cam1", {"conf_threshold": 0.7})[0] == 200
        assert via.send("DELETE", "/v1/streams/old")[0] == 204
        assert a.get("/v1/streams/cam9/zones")[0] == 404
        assert b.send("PUT", "/v1/streams/cam9/zones/door", DOOR)[0] == 404

        for svc in nodes:
            svc.process.stop()
        nodes = [start("a"), start("b")]

        def restored() -> bool:
            shown = _streams(nodes[0])
            return sorted(shown) == ["cam1", "cam2"] and all(
                s["status"]["frames_processed"] > 0 for s in shown.values()
            )

        wait_until(restored, 60, what="both streams running again")
        for svc in nodes:
            shown = _streams(svc)
            assert "old" not in shown, "a configured source removed over the API stays removed"
            assert shown["cam1"]["spec"]["conf_threshold"] == 0.7
            assert [z["id"] for z in shown["cam2"]["spec"]["zones"]] == ["door"]
    finally:
        for svc in nodes:
            svc.process.stop()
        server.stop()
