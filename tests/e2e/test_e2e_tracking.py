"""Tracking in the whole CPU service: the demo model on the committed sample clip, a zone over
the whole frame, zone events over WebSocket and resume across one.

The clip is served in real time at 2 frames per second (its first frames, re-encoded): each
frame has 500 ms to be detected and tracked before the next arrives, so even on a loaded
machine the stream processes consecutive frames (after the first, which also waits for the
model's first run) and the ids asserted on do not depend on which frames a slow moment
dropped (at the clip's own 30 fps a loaded machine drops most of them). The tracking loops
are compiled before the stream starts (tests/conftest.py), for the same reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import truth
from support.apptest import TestClient
from support.videos import write_slowed_copy

from vdet.api.app import create_app
from vdet.config.settings import Settings
from vdet.core.assets import asset_path

pytestmark = pytest.mark.slow

WHOLE_FRAME = {"id": "all", "kind": "polygon", "points": [[0, 0], [1, 0], [1, 1], [0, 1]]}
MIDDLE = {"id": "middle", "kind": "line", "points": [[0.5, 0], [0.5, 1]]}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(
        model_path=asset_path("demo.onnx"),
        backend="onnxruntime",
        ingest={"source_policy": {"file_roots": [str(tmp_path)]}},
    )
    with TestClient(create_app(settings)) as c:
        yield c


def _results(ws: Any, count: int) -> list[dict[str, Any]]:
    out = []
    while len(out) < count:
        message = ws.receive_json()
        assert message["type"] == "result", message
        out.append(message["result"])
    return out


def test_zone_events_over_websocket_and_resume(client: TestClient, tmp_path: Path) -> None:
    clip = write_slowed_copy(truth.SAMPLE, tmp_path / "sample-2fps.mp4", frames=16, fps=2)
    body = {
        "id": "sample",
        "url": str(clip),
        "realtime": True,
        "zones": [WHOLE_FRAME, MIDDLE],
    }
    assert client.post("/v1/streams", json=body).status_code == 201
    with client.websocket_connect("/v1/streams/sample/events?after=0") as ws:
        results = _results(ws, 6)
    first = results[0]
    tracked = {d["track_id"] for d in first["detections"] if d["track_id"] is not None}
    assert len(tracked) >= 8  # the clip's first frame holds 13 objects, most of them clear
    enters = [e for e in first["events"] if e["type"] == "zone_enter"]
    # Every object tracked on the first frame is inside a zone covering the frame.
    assert {e["track_id"] for e in enters} == tracked
    assert all(e["zone"] == "all" and e["dwell_s"] is None for e in enters)
    by_id = {d["track_id"]: d["class_name"] for d in first["detections"]}
    assert all(by_id[e["track_id"]] == e["class_name"] for e in enters)
    # Ids are stable: most objects of the first result keep their id later on.
    later = {d["track_id"] for d in results[-1]["detections"]}
    assert len(tracked & later) >= len(tracked) // 2

    # Reconnecting just before the event result replays it, events included.
    seq = first["seq"]
    with client.websocket_connect(f"/v1/streams/sample/events?after={seq - 1}") as ws:
        (replayed,) = _results(ws, 1)
    assert replayed["seq"] == seq and replayed["events"] == first["events"]
    metrics = client.get("/metrics").text
    assert 'vdet_zone_objects{class="' in metrics and 'source="sample",zone="all"' in metrics
