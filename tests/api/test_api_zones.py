"""Tracking through the real app: track ids on results, the zones API, zone events in the
seq-numbered feed (and WebSocket resume across one), tracking metrics, PATCH of settings.

The tiny model sees the same three objects on every frame of a real H.264 clip (person 0.9,
car 0.6, dog 0.3): two tracks with stable ids, and a dog too weak to start one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.apptest import CLIP_WH, TestClient, expected_box, stream_body
from support.waiting import wait_until

W, H = CLIP_WH
PERSON = expected_box(0)
# A zone around the person's box centre only, in pixels and normalised.
PERSON_CX, PERSON_CY = (PERSON[0] + PERSON[2]) / 2, (PERSON[1] + PERSON[3]) / 2
AROUND_PERSON = [
    [PERSON_CX - 4, PERSON_CY - 4],
    [PERSON_CX + 4, PERSON_CY - 4],
    [PERSON_CX + 4, PERSON_CY + 4],
    [PERSON_CX - 4, PERSON_CY + 4],
]


def latest(client: TestClient, after: int = 0) -> dict[str, Any]:
    def newer() -> dict[str, Any]:
        r = client.get("/v1/streams/cam/detections")
        body: dict[str, Any] = r.json() if r.status_code == 200 else {}
        return body if body.get("seq", 0) > after else {}

    return wait_until(newer, 10, what=f"a result after seq {after}")


def test_results_carry_stable_track_ids(client: TestClient, clip: Path) -> None:
    assert client.post("/v1/streams", json=stream_body(clip)).status_code == 201
    first = latest(client)
    second = latest(client, first["seq"] + 3)
    for result in (first, second):
        tracks = {d["class_name"]: d["track_id"] for d in result["detections"]}
        assert tracks == {"person": 1, "car": 2, "dog": None}  # the dog scores under 0.6
        assert result["events"] == []


def test_tracking_can_be_turned_off_and_on(client: TestClient, clip: Path) -> None:
    body = stream_body(clip, tracking={"enabled": False})
    assert client.post("/v1/streams", json=body).status_code == 201
    result = latest(client)
    assert all(d["track_id"] is None for d in result["detections"])
    r = client.patch(
        "/v1/streams/cam", json={"tracking": {"track_threshold": 0.2, "new_track_threshold": 0.2}}
    )
    assert r.status_code == 200, r.text
    assert r.json()["spec"]["tracking"]["enabled"] is True
    result = latest(client, result["seq"] + 2)
    assert all(d["track_id"] is not None for d in result["detections"])  # the dog too now


def test_zone_crud(client: TestClient, clip: Path) -> None:
    assert client.post("/v1/streams", json=stream_body(clip)).status_code == 201
    assert client.get("/v1/streams/cam/zones").json() == {"zones": []}
    zone = {"kind": "polygon", "points": AROUND_PERSON, "normalized": False}
    r = client.put("/v1/streams/cam/zones/door", json=zone)
    assert r.status_code == 201, r.text
    assert r.headers["location"] == "/v1/streams/cam/zones/door"
    assert r.json()["id"] == "door" and r.json()["classes"] is None
    line = {"kind": "line", "points": [[0.5, 0], [0.5, 1]], "classes": ["car"]}
    assert client.put("/v1/streams/cam/zones/gate", json=line).status_code == 201
    assert client.put("/v1/streams/cam/zones/gate", json=line).status_code == 200  # replaced
    zones = client.get("/v1/streams/cam/zones").json()["zones"]
    assert [(z["id"], z["kind"], z["normalized"]) for z in zones] == [
        ("door", "polygon", False),
        ("gate", "line", True),
    ]
    assert zones[1]["points"] == [[0.5, 0.0], [0.5, 1.0]]
    assert client.get("/v1/streams/cam/zones/gate").json()["classes"] == ["car"]
    assert client.get("/v1/streams/cam").json()["spec"]["zones"] == zones  # one truth
    assert client.delete("/v1/streams/cam/zones/gate").status_code == 204
    assert client.get("/v1/streams/cam/zones/gate").status_code == 404
    assert client.delete("/v1/streams/cam/zones/gate").status_code == 404
    r = client.put("/v1/streams/cam/zones", json={"zones": [{"id": "all", **line}]})
    assert r.status_code == 200 and [z["id"] for z in r.json()["zones"]] == ["all"]
    assert client.delete("/v1/streams/cam/zones").status_code == 204
    assert client.get("/v1/streams/cam/zones").json() == {"zones": []}
    assert client.get("/v1/streams/nope/zones").status_code == 404
    assert client.put("/v1/streams/nope/zones/a", json=line).status_code == 404


@pytest.mark.parametrize(
    ("zone", "message"),
    [
        ({"kind": "polygon", "points": [[0, 0], [1, 1], [1, 0], [0, 1]]}, "crosses itself"),
        ({"kind": "polygon", "points": [[0, 0], [2, 0], [1, 1]]}, "outside the normalised"),
        (
            {"kind": "polygon", "points": [[0, 0], [500, 0], [0, 50]], "normalized": False},
            "outside the stream's 128x96 frame",
        ),
        ({"kind": "line", "points": [[0, 0], [1, 1]], "classes": ["cat"]}, "unknown class"),
        ({"kind": "line", "points": [[0, 0], [1, 1], [1, 0]]}, "exactly 2 points"),
        ({"kind": "line", "points": [[0, 0], [1, 1]], "colour": "red"}, "colour"),
        ({"kind": "circle", "points": [[0, 0], [1, 1]]}, "kind"),
    ],
)
def test_invalid_zones_are_clear_422s(
    client: TestClient, clip: Path, zone: dict[str, Any], message: str
) -> None:
    assert client.post("/v1/streams", json=stream_body(clip)).status_code == 201
    latest(client)  # the frame size is known from here on
    r = client.put("/v1/streams/cam/zones/bad", json=zone)
    assert r.status_code == 422 and message in str(r.json()["detail"]), r.text
    assert client.get("/v1/streams/cam/zones").json() == {"zones": []}  # nothing half-applied


def test_too_many_zones_and_duplicate_ids_are_refused(client: TestClient, clip: Path) -> None:
    assert client.post("/v1/streams", json=stream_body(clip)).status_code == 201
    line = {"kind": "line", "points": [[0, 0], [1, 1]]}
    many = [{"id": f"z{i}", **line} for i in range(17)]
    r = client.put("/v1/streams/cam/zones", json={"zones": many})
    assert r.status_code == 422
    r = client.put("/v1/streams/cam/zones", json={"zones": [{"id": "a", **line}] * 2})
    assert r.status_code == 422 and "more than once" in str(r.json()["detail"])
    for i in range(16):
        assert client.put(f"/v1/streams/cam/zones/z{i}", json=line).status_code == 201
    r = client.put("/v1/streams/cam/zones/one-too-many", json=line)
    assert r.status_code == 422 and "16" in str(r.json()["detail"])


def test_zone_events_ride_on_results_and_resume_covers_them(client: TestClient, clip: Path) -> None:
    assert client.post("/v1/streams", json=stream_body(clip)).status_code == 201
    before = latest(client)["seq"]
    zone = {"kind": "polygon", "points": AROUND_PERSON, "normalized": False}
    assert client.put("/v1/streams/cam/zones/door", json=zone).status_code == 201
    with client.websocket_connect(f"/v1/streams/cam/events?after={before}") as ws:
        for _ in range(100):
            message = ws.receive_json()
            if message["result"]["events"]:
                break
    event_result = message["result"]
    assert event_result["events"] == [
        {
            "type": "zone_enter",
            "zone": "door",
            "track_id": 1,
            "class_id": 0,
            "class_name": "person",
            "direction": None,
            "dwell_s": None,
        }
    ]
    # Reconnect from just before it: the same result, events included, comes back first.
    seq = event_result["seq"]
    with client.websocket_connect(f"/v1/streams/cam/events?after={seq - 1}") as ws:
        replayed = ws.receive_json()["result"]
    assert replayed["seq"] == seq and replayed["events"] == event_result["events"]

    # Removing the zone: the track was inside, no exit event is invented, the gauge goes.
    def zone_gauges() -> list[tuple[dict[str, str], float]]:
        text = client.get("/metrics").text
        return [
            (s.labels, s.value)
            for f in text_string_to_metric_families(text)
            if f.name == "vdet_zone_objects"
            for s in f.samples
        ]

    assert wait_until(
        lambda: ({"source": "cam", "zone": "door", "class": "person"}, 1.0) in zone_gauges(),
        10,
        what="the zone gauge",
    )
    assert client.delete("/v1/streams/cam/zones/door").status_code == 204
    wait_until(lambda: zone_gauges() == [], 10, what="the zone gauge to go")
    text = client.get("/metrics").text
    assert 'vdet_tracks_started_total{class="person",source="cam"} 1.0' in text
    assert 'vdet_tracks_started_total{class="car",source="cam"} 1.0' in text


def test_zones_in_the_stream_spec_and_patch(client: TestClient, clip: Path) -> None:
    zone = {"id": "door", "kind": "polygon", "points": AROUND_PERSON, "normalized": False}
    body = stream_body(clip, zones=[zone], tracking={"lost_track_buffer": 5})
    r = client.post("/v1/streams", json=body)
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["tracking"]["lost_track_buffer"] == 5
    r = client.post("/v1/streams", json=stream_body(clip, "x", tracking={"lost": 1}))
    assert r.status_code == 422
    r = client.patch("/v1/streams/cam", json={"zones": None, "tracking": None})
    assert r.status_code == 200, r.text
    assert r.json()["spec"]["zones"] == []
    assert r.json()["spec"]["tracking"]["lost_track_buffer"] == 30
    r = client.patch("/v1/streams/cam", json={"zones": [{**zone, "classes": ["cat"]}]})
    assert r.status_code == 422 and "unknown class" in r.text


def test_turning_tracking_off_drops_the_zone_gauges(client: TestClient, clip: Path) -> None:
    zone = {"id": "door", "kind": "polygon", "points": AROUND_PERSON, "normalized": False}
    assert client.post("/v1/streams", json=stream_body(clip, zones=[zone])).status_code == 201
    wait_until(lambda: 'zone="door"' in client.get("/metrics").text, 10, what="a zone gauge")
    r = client.patch("/v1/streams/cam", json={"tracking": {"enabled": False}})
    assert r.status_code == 200
    wait_until(lambda: 'zone="door"' not in client.get("/metrics").text, 10, what="no gauge")


def test_a_mask_drops_what_it_covers_before_tracking_and_zones(
    client: TestClient, clip: Path
) -> None:
    """A mask over the person's centre: the person leaves the results, starts no track and
    enters no zone around it; a mask of dogs only over the whole frame drops the dog alone."""
    door = {"id": "door", "kind": "polygon", "points": AROUND_PERSON, "normalized": False}
    body = stream_body(clip, zones=[door])
    assert client.post("/v1/streams", json=body).status_code == 201
    unmasked = latest(client)
    assert sorted(d["class_name"] for d in unmasked["detections"]) == ["car", "dog", "person"]

    poster = {"kind": "mask", "points": AROUND_PERSON, "normalized": False}
    assert client.put("/v1/streams/cam/zones/poster", json=poster).status_code == 201
    no_dogs = {"kind": "mask", "points": [[0, 0], [1, 0], [1, 1], [0, 1]], "classes": ["dog"]}
    assert client.put("/v1/streams/cam/zones/no-dogs", json=no_dogs).status_code == 201
    masked = latest(client, unmasked["seq"] + 2)
    assert [d["class_name"] for d in masked["detections"]] == ["car"]
    assert masked["events"] == [] or all(e["type"] == "zone_exit" for e in masked["events"])
    zones = client.get("/v1/streams/cam/zones").json()["zones"]
    assert [(z["id"], z["kind"]) for z in zones] == [
        ("door", "polygon"),
        ("poster", "mask"),
        ("no-dogs", "mask"),
    ]

    # Gone again: the person comes back, as a track.
    assert client.delete("/v1/streams/cam/zones/poster").status_code == 204
    back = latest(client, masked["seq"] + 2)
    assert sorted(d["class_name"] for d in back["detections"]) == ["car", "person"]
