"""A fleet of real `vdet serve` nodes (settings `cluster`) on a real NATS server: the installed
entry point on the CPU backend, real H.264 files, each node its own process.

What a user of the fleet sees through any node's API: configured sources seeded once, streams
added on one node and placed on either within capacity, `/v1/nodes`, the one WebSocket feed
carrying the whole fleet's results with the bus's sequence (a client resumes on another node
with no gap and no duplicate), changes and removals through any node, the API's errors
unchanged, and a node killed with SIGKILL whose streams publish again on the other.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.apptest import CLIP_WH, write_tiny_model
from support.nats_servers import NatsServer, nats_server_binary, single_server
from support.procs import http_get
from support.serve import Service, start_service
from support.videos import write_h264_clip
from support.waiting import wait_until
from websockets.sync.client import connect

pytestmark = pytest.mark.slow

LEASE_S = 2.0
MAX_PAYLOAD = 16384
PART = MAX_PAYLOAD - 4096  # what of a clip one answer carries (vdet.api.fleet_clips)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fleet-serve")


@pytest.fixture(scope="module")
def model(folder: Path) -> Path:
    return write_tiny_model(folder / "tiny.onnx")


@pytest.fixture(scope="module")
def clip(folder: Path) -> Path:
    return write_h264_clip(folder / "clip.mp4", seconds=2.0, fps=15, size_wh=CLIP_WH)


@pytest.fixture(scope="module")
def nats_server(folder: Path) -> Iterator[NatsServer]:
    nats_server_binary()
    # A small max_payload: a clip crosses from node to node in several parts.
    server = single_server(folder / "nats", extra_config=[f"max_payload: {MAX_PAYLOAD}"])
    yield server
    server.stop()


def stream(clip: Path, stream_id: str, **fields: Any) -> dict[str, Any]:
    return {"id": stream_id, "url": str(clip), "loop": True, "realtime": True, **fields}


def node(
    folder: Path, model: Path, server: NatsServer, name: str, clip: Path, **settings: Any
) -> Service:
    return start_service(
        folder,
        model,
        cluster={
            "servers": [server.url],
            "node_id": name,
            "capacity": 3,
            "lease_s": LEASE_S,
            "prefix": "t",
        },
        # Both nodes are configured alike, as a compose file or a StatefulSet would make them.
        sources=[stream(clip, "cam1")],
        # Each node its own disk.
        clips={
            "folder": str(folder / f"clips-{name}"),
            "pre_roll_s": 0.5,
            "post_roll_s": 0.5,
            "max_clip_s": 1.5,
        },
        **settings,
    )


def placement(svc: Service) -> dict[str, str]:
    status, body = svc.get("/v1/nodes")
    assert status == 200, body
    return {s: n["id"] for n in body["nodes"] for s in n["streams"]}


def results(url: str, count: int, timeout: float = 60) -> list[dict[str, Any]]:
    """The first `count` result messages of a WebSocket feed."""
    out: list[dict[str, Any]] = []
    with connect(url, open_timeout=10) as ws:
        deadline = time.monotonic() + timeout
        while len(out) < count:
            message = json.loads(ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if message["type"] == "result":
                out.append(message["result"])
    return out


@pytest.fixture(scope="module")
def fleet(
    folder: Path, model: Path, nats_server: NatsServer, clip: Path
) -> Iterator[dict[str, Service]]:
    # Node b runs its streams in a worker process, as a GPU node would.
    workers = {"b": {"workers": {"processes": 1, "streams_per_process": 4}}}
    nodes = {
        name: node(folder, model, nats_server, name, clip, **workers.get(name, {}))
        for name in ("a", "b")
    }
    try:
        yield nodes
    finally:
        for svc in nodes.values():
            svc.process.stop()


def test_the_fleet_places_streams_added_on_any_node_and_feeds_every_node(
    fleet: dict[str, Service], clip: Path
) -> None:
    a, b = fleet["a"], fleet["b"]
    assert b.send("POST", "/v1/streams", stream(clip, "cam2"))[0] == 201
    assert a.send("POST", "/v1/streams", stream(clip, "cam3"))[0] == 201
    wait_until(lambda: len(placement(a)) == 3, 30, what="three streams placed")
    placed = placement(a)
    assert placement(b) == placed, "every node sees one placement"
    # The configured source was seeded once though both nodes have it; within capacity.
    assert sorted(placed) == ["cam1", "cam2", "cam3"]
    assert max(list(placed.values()).count(n) for n in ("a", "b")) <= 3
    status, body = a.get("/v1/nodes")
    assert status == 200 and body["unowned"] == [] and body["synced"] and body["node"] == "a"

    # The one feed: every stream's results on each node, numbered by the bus, in order.
    on_a = results(f"{a.ws_base}/v1/events", 45)
    seqs = [r["seq"] for r in on_a]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert {r["source_id"] for r in on_a} == {"cam1", "cam2", "cam3"}
    # Resume on the other node after the last seq read here: the next one, nothing twice.
    on_b = results(f"{b.ws_base}/v1/events?after={seqs[-1]}", 10)
    assert on_b[0]["seq"] == seqs[-1] + 1, "no gap between the nodes"
    assert [r["seq"] for r in on_b] == list(range(seqs[-1] + 1, seqs[-1] + 11))
    # Each node's metrics: the fleet it sees, its leases, its bus traffic.
    seen = {name: svc.metrics() for name, svc in fleet.items()}
    for name, m in seen.items():
        assert m[("vdet_fleet_nodes", ())] == 2
        assert m[("vdet_fleet_unowned_streams", ())] == 0
        assert m[("vdet_fleet_leases_held", ())] == list(placed.values()).count(name)
        assert m[("vdet_fleet_results_total", (("outcome", "read"),))] > 0
        claimed = m.get(("vdet_fleet_lease_events_total", (("event", "claimed"),)), 0)
        assert claimed == list(placed.values()).count(name)
    published = sum(
        m.get(("vdet_fleet_results_total", (("outcome", "published"),)), 0) for m in seen.values()
    )
    assert published > 0
    # And a replay from before: the same results under the same numbers on both nodes.
    first = seqs[0]
    again = results(f"{b.ws_base}/v1/events?after={first - 1}", 20)
    assert [(r["seq"], r["source_id"], r["frame_index"]) for r in again] == [
        (r["seq"], r["source_id"], r["frame_index"]) for r in on_a[:20]
    ]


def test_every_node_reads_every_stream(fleet: dict[str, Service]) -> None:
    """Reads of a stream on another node are asked of its owner (NATS request/reply)."""
    a, b = fleet["a"], fleet["b"]
    wait_until(lambda: len(placement(a)) == 3, 30, what="three streams placed")
    placed = placement(a)
    for svc in (a, b):
        status, listing = svc.get("/v1/streams")
        assert status == 200
        shown = {s["id"]: s for s in listing["streams"]}
        assert sorted(shown) == ["cam1", "cam2", "cam3"]
        for stream_id, owner in placed.items():
            assert shown[stream_id]["node"] == owner
            assert shown[stream_id]["spec"]["url"].endswith("clip.mp4")

            def streaming(svc: Service = svc, stream_id: str = stream_id) -> bool:
                status, one = svc.get(f"/v1/streams/{stream_id}")
                return status == 200 and one["status"]["frames_processed"] > 0

            wait_until(streaming, 30, what=f"{stream_id} read through node {svc.base}")
            status, one = svc.get(f"/v1/streams/{stream_id}")
            assert one["node"] == owner and one["status"]["state"] == "streaming"
            # The latest detections come from this node's hub, which has the whole fleet's.
            status, latest = svc.get(f"/v1/streams/{stream_id}/detections")
            assert status == 200 and latest["source_id"] == stream_id
            # Its frame comes with the bus's seq of its result (the owner's hub numbers its
            # own results as they come back off the bus, in a worker process or not).
            url = f"{svc.base}/v1/streams/{stream_id}/snapshot.jpg"
            with urllib.request.urlopen(url, timeout=10) as response:
                jpeg, seq = response.read(), int(response.headers["X-Vdet-Seq"])
            assert jpeg.startswith(b"\xff\xd8") and 0 < seq <= latest["seq"] + 1000, stream_id
    assert a.get("/v1/streams/none")[0] == 404 and b.get("/v1/streams/none/detections")[0] == 404


WHOLE_FRAME = {"id": "all", "kind": "polygon", "points": [[0, 0], [1, 0], [1, 1], [0, 1]]}


def live_part(svc: Service, stream_id: str, timeout: float = 20) -> tuple[dict[str, str], bytes]:
    """The first part of a stream's live MJPEG view through `svc`: its headers and JPEG."""
    url = f"{svc.base}/v1/streams/{stream_id}/live.mjpeg?fps=5&max_width=320"
    with urllib.request.urlopen(url, timeout=timeout) as response:
        assert response.status == 200
        assert response.headers["content-type"].startswith("multipart/x-mixed-replace")
        data = b""
        while data.count(b"\r\n\r\n") < 1 or b"\xff\xd9" not in data:
            chunk = response.read1(65536)
            assert chunk, "the live view ended"
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    headers = dict(line.split(": ", 1) for line in head.decode().split("\r\n") if ": " in line)
    return headers, body[: body.index(b"\xff\xd9") + 2]


def test_event_snapshots_live_view_and_workers_through_any_node(
    fleet: dict[str, Service], clip: Path
) -> None:
    """What only the owner has (event snapshot JPEGs, decoded frames, its worker processes) is
    asked of it by the node a client calls."""
    a, b = fleet["a"], fleet["b"]
    assert a.send("POST", "/v1/streams", stream(clip, "gate", zones=[WHOLE_FRAME]))[0] == 201
    try:
        wait_until(lambda: "gate" in placement(a), 30, what="gate placed")
        owner_name = placement(a)["gate"]
        for svc in (a, b):

            def kept(svc: Service = svc) -> list[dict[str, Any]]:
                status, body = svc.get("/v1/streams/gate/snapshots")
                assert status == 200, body
                return list(body["snapshots"])

            first = wait_until(kept, 30, what=f"an event snapshot through {svc.base}")[0]
            assert {e["zone"] for e in first["events"]} == {"all"}
            status, jpeg = http_get(f"{svc.base}{first['url']}", 10)
            assert status == 200 and jpeg.startswith(b"\xff\xd8") and len(jpeg) == first["bytes"]
            status, _ = http_get(f"{svc.base}/v1/streams/gate/snapshots/999999.jpg", 10)
            assert status == 404
            headers, frame = live_part(svc, "gate")
            assert frame.startswith(b"\xff\xd8") and int(headers["X-Vdet-Seq"]) > 0
            assert headers["X-Vdet-Source-Size"] == f"{CLIP_WH[0]}x{CLIP_WH[1]}"
        assert a.get("/v1/streams/none/snapshots")[0] == 404
        assert http_get(f"{b.base}/v1/streams/none/live.mjpeg", 10)[0] == 404
        # Every node lists the fleet's workers: b's one process, from either node.
        for svc in (a, b):
            status, body = svc.get("/v1/workers")
            assert status == 200 and body["unanswered"] == [], body
            shown = [(w["node"], w["role"], w["alive"]) for w in body["workers"]]
            assert ("b", "worker", True) in shown and all(n == "b" for n, _, _ in shown)
        # The bus's cost, seen by the node that publishes gate's results.
        metrics = fleet[owner_name].metrics()
        assert metrics[("vdet_fleet_bus_ack_seconds_count", ())] > 0
        assert ("vdet_fleet_results_lag", ()) in metrics
    finally:
        assert a.send("DELETE", "/v1/streams/gate")[0] == 204


def fetch(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return int(response.status), dict(response.headers), bytes(response.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), dict(exc.headers), bytes(exc.read())


def test_clips_are_listed_served_and_deleted_through_any_node(
    fleet: dict[str, Service], folder: Path
) -> None:
    """A clip stays on the disk of the node that recorded it; any node lists it, serves it
    (whole, or the byte range asked for, in parts of a NATS message) and deletes it, also
    after its stream is removed."""
    a, b = fleet["a"], fleet["b"]
    # Larger frames than the other streams': clips of several NATS messages.
    video_file = write_h264_clip(folder / "door.mp4", seconds=2.0, fps=15, size_wh=(1280, 720))
    assert a.send("POST", "/v1/streams", stream(video_file, "door", zones=[WHOLE_FRAME]))[0] == 201
    removed = False
    try:
        wait_until(lambda: "door" in placement(a), 30, what="door placed")
        owner_name = placement(a)["door"]
        owner, other = fleet[owner_name], b if owner_name == "a" else a

        def listed(svc: Service = other) -> list[dict[str, Any]]:
            status, body = svc.get("/v1/streams/door/clips")
            assert status == 200, body
            assert body["unanswered"] == []
            return [c for c in body["clips"] if c["bytes"] > 2 * PART] or []

        kept = wait_until(listed, 40, what="a clip larger than two NATS messages")[0]
        assert kept["node"] == owner_name and kept["url"].startswith("/v1/streams/door/clips/")
        on_disk = folder / f"clips-{owner_name}" / "door"
        video = (on_disk / f"{kept['clip_id']}.mp4").read_bytes()
        assert len(video) == kept["bytes"]
        assert fetch(f"{owner.base}{kept['url']}")[2] == video
        status, headers, whole = fetch(f"{other.base}{kept['url']}")
        assert status == 200 and whole == video, (status, len(whole), len(video))
        assert headers["content-type"] == kept["media_type"]
        assert headers["accept-ranges"] == "bytes"
        # A range across parts, an open one and a suffix, as a browser seeking asks them.
        size = len(video)
        for asked, want in (
            (f"bytes=100-{PART + 200}", video[100 : PART + 201]),
            (f"bytes={size - 10}-", video[-10:]),
            ("bytes=-700", video[-700:]),
        ):
            status, headers, part = fetch(f"{other.base}{kept['url']}", {"Range": asked})
            assert status == 206 and part == want, (asked, status, len(part))
            assert headers["content-range"].endswith(f"/{size}")
        status, headers, _ = fetch(f"{other.base}{kept['url']}", {"Range": f"bytes={size}-"})
        assert status == 416 and headers["content-range"] == f"bytes */{size}"
        assert fetch(f"{other.base}/v1/streams/door/clips/1000000000000")[0] == 404
        # The stream removed, its clips stay listed and served through either node.
        assert a.send("DELETE", "/v1/streams/door")[0] == 204
        removed = True
        wait_until(lambda: "door" not in placement(other), 20, what="door gone")
        for svc in (a, b):
            ids = [c["clip_id"] for c in listed(svc)]
            assert kept["clip_id"] in ids
        # Deleted through the node that does not keep it: gone from its disk and every listing.
        assert other.send("DELETE", kept["url"])[0] == 204
        assert not (on_disk / f"{kept['clip_id']}.mp4").exists()
        for svc in (a, b):  # a removed stream with no clip left is no stream at all
            status, body = svc.get("/v1/streams/door/clips")
            assert status == 404 or kept["clip_id"] not in [c["clip_id"] for c in body["clips"]]
        assert other.send("DELETE", kept["url"])[0] == 404
        assert a.get("/v1/streams/none/clips")[0] == 404
    finally:
        if not removed:
            a.send("DELETE", "/v1/streams/door")


def test_changes_and_errors_through_any_node(fleet: dict[str, Service], clip: Path) -> None:
    a, b = fleet["a"], fleet["b"]
    wait_until(lambda: "cam2" in placement(a), 30, what="cam2 placed")
    owner = fleet[placement(a)["cam2"]]
    other = b if owner is a else a
    # A change through the node that does not run it reaches the one that does, in place.
    status, out = other.send("PATCH", "/v1/streams/cam2", {"conf_threshold": 0.61})
    assert status == 200, out
    assert out["spec"]["conf_threshold"] == 0.61

    def applied() -> bool:
        status, view = owner.get("/v1/streams/cam2")
        return status == 200 and view["spec"]["conf_threshold"] == 0.61

    wait_until(applied, 20, what="the change applied on the owner")
    # The API's errors keep their statuses and messages on every node.
    assert other.send("POST", "/v1/streams", stream(clip, "cam2"))[0] == 409
    status, out = other.send("POST", "/v1/streams", stream(clip, "x", classes=["nope"]))
    assert status == 422 and "nope" in json.dumps(out)
    status, out = other.send("POST", "/v1/streams", stream(clip, ".x"))
    assert status == 422 and "NATS subject" in out["detail"]
    assert other.send("PATCH", "/v1/streams/none", {"conf_threshold": 0.5})[0] == 404
    assert other.send("DELETE", "/v1/streams/none")[0] == 404
    # Removed through one node: gone from the fleet, its results' subscribers told so.
    with connect(f"{owner.ws_base}/v1/streams/cam3/events", open_timeout=10) as ws:
        assert a.send("DELETE", "/v1/streams/cam3")[0] == 204
        deadline = time.monotonic() + 20
        ended = None
        while ended is None and time.monotonic() < deadline:
            message = json.loads(ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if message["type"] != "result":
                ended = message
    assert ended is not None and ended["type"] == "stream_removed", ended
    wait_until(lambda: "cam3" not in placement(b), 20, what="cam3 gone from the fleet")
    assert b.send("POST", "/v1/streams", stream(clip, "cam3"))[0] == 201, "its id is free again"


def test_a_killed_node_s_streams_publish_again_on_the_other(fleet: dict[str, Service]) -> None:
    wait_until(lambda: len(placement(fleet["b"])) == 3, 30, what="three streams placed")
    victim = "a" if "a" in placement(fleet["b"]).values() else "b"
    name = "b" if victim == "a" else "a"
    survivor = fleet[name]
    moved = sorted(s for s, n in placement(survivor).items() if n == victim)
    assert moved
    killed_at = time.monotonic()
    os.kill(fleet[victim].process.popen.pid, signal.SIGKILL)
    fleet[victim].process.popen.wait(10)
    # Before the lease expires, a read of its stream is answered at once, with the reason.
    asked = time.monotonic()
    status, one = survivor.get(f"/v1/streams/{moved[0]}")
    assert status == 200 and time.monotonic() - asked < 4.0
    assert one["node"] == name or "does not answer" in (one["status"]["last_error"] or ""), one
    # Its streams are claimed by the survivor once their leases expire...
    wait_until(
        lambda: all(placement(survivor).get(s) == name for s in moved),
        LEASE_S + 10,
        what=f"{moved} claimed by {name}",
    )
    claimed = time.monotonic() - killed_at
    # ... and publish there: live results of each, after the victim died.
    seen: set[str] = set()
    with connect(f"{survivor.ws_base}/v1/events", open_timeout=10) as ws:
        deadline = time.monotonic() + 20
        while not set(moved) <= seen and time.monotonic() < deadline:
            message = json.loads(ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if message["type"] == "result":
                seen.add(message["result"]["source_id"])
    took = time.monotonic() - killed_at
    assert set(moved) <= seen, f"{moved} not publishing on the survivor ({seen})"
    status, listing = survivor.get("/v1/streams")
    assert status == 200 and {s["node"] for s in listing["streams"]} == {name}
    status, body = survivor.get("/v1/nodes")
    assert status == 200 and [n["id"] for n in body["nodes"]] == [name] and body["unowned"] == []
    print(
        f"{moved}: claimed {claimed:.1f} s, publishing {took:.1f} s after SIGKILL "
        f"(lease {LEASE_S} s)"
    )
