"""Event snapshots through the real app (ONNX Runtime, a real H.264 clip): a zone over the whole
frame makes the tiny model's tracks enter it, the frames of those events are listed and served
as JPEGs (decoded back here), the webhook body names its frame's snapshot, and what is not kept
is a 404."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from support.apptest import CLIP_WH, MakeSettings, TestClient, stream_body
from support.waiting import wait_until
from support.webhooks import Receiver

from vdet.api.app import create_app
from vdet.config.event_snapshots import EventSnapshotSettings
from vdet.config.notify import NotifySettings

WHOLE_FRAME = {"id": "all", "kind": "polygon", "points": [[0, 0], [1, 0], [1, 1], [0, 1]]}


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def listing(client: TestClient, stream_id: str = "gate") -> dict[str, Any]:
    r = client.get(f"/v1/streams/{stream_id}/snapshots")
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def test_frames_with_zone_events_are_served_as_jpegs_and_named_in_webhook_bodies(
    make_settings: MakeSettings, clip: Path, receiver: Receiver
) -> None:
    settings = make_settings(
        notify={"webhooks": [{"id": "ops", "url": receiver.url, "events": ["zone_enter"]}]},
        sources=[stream_body(clip, "gate", zones=[WHOLE_FRAME])],
        event_snapshots={"max_width": 64},
    )
    with TestClient(create_app(settings)) as client:
        kept = wait_until(lambda: listing(client)["snapshots"], 20, what="a snapshot")
        first = kept[0]
        assert {e["type"] for e in first["events"]} == {"zone_enter"}
        assert {e["zone"] for e in first["events"]} == {"all"}
        scaled = (64, 64 * CLIP_WH[1] // CLIP_WH[0])  # the clip scaled down to max_width
        assert (first["width"], first["height"]) == scaled
        r = client.get(first["url"])
        assert r.status_code == 200 and r.headers["content-type"] == "image/jpeg"
        assert r.headers["x-vdet-frame-index"] == str(first["frame_index"])
        assert len(r.content) == first["bytes"]
        image = cv2.imdecode(np.frombuffer(r.content, np.uint8), cv2.IMREAD_COLOR)
        assert image.shape == (scaled[1], scaled[0], 3)

        wait_until(lambda: receiver.requests, 20, what="a webhook delivery")
        body = receiver.bodies()[0]
        assert body["snapshot"] == f"/v1/streams/gate/snapshots/{body['frame_index']}.jpg"
        r = client.get(body["snapshot"])
        assert r.status_code == 200 and r.headers["content-type"] == "image/jpeg"

        # A frame without events (the tracks are inside from then on) has none.
        latest = client.get("/v1/streams/gate/detections").json()
        if latest["events"] == []:
            r = client.get(f"/v1/streams/gate/snapshots/{latest['frame_index']}.jpg")
            assert r.status_code == 404 and "no snapshot of frame" in r.json()["detail"]
        assert client.get("/v1/streams/nope/snapshots").status_code == 404
        assert client.get("/v1/streams/nope/snapshots/1.jpg").status_code == 404
        assert client.get("/v1/streams/gate/snapshots/-1.jpg").status_code == 422
        assert client.get("/v1/streams/gate/snapshots/x.jpg").status_code == 422
        counts = listing(client)
        assert counts["kept"] >= 1 and counts["failed"] == 0
        metrics = client.get("/metrics").text
        assert 'vdet_event_snapshots_total{outcome="kept",source="gate"}' in metrics
        assert 'vdet_event_snapshots_total{outcome="failed",source="gate"} 0.0' in metrics

        # Removed and added again under its id: nothing of before is kept.
        assert client.delete("/v1/streams/gate").status_code == 204
        assert client.post("/v1/streams", json=stream_body(clip, "gate")).status_code == 201
        assert listing(client) == {"snapshots": [], "kept": 0, "skipped": 0, "failed": 0}


def test_with_no_snapshots_kept_none_are_taken_and_bodies_name_none(
    make_settings: MakeSettings, clip: Path, receiver: Receiver
) -> None:
    settings = make_settings(
        notify={"webhooks": [{"id": "ops", "url": receiver.url}]},
        sources=[stream_body(clip, "gate", zones=[WHOLE_FRAME])],
        event_snapshots={"per_stream": 0},
    )
    with TestClient(create_app(settings)) as client:
        wait_until(lambda: receiver.requests, 20, what="a webhook delivery")
        assert listing(client) == {"snapshots": [], "kept": 0, "skipped": 0, "failed": 0}
        frame_index = receiver.bodies()[0]["frame_index"]
        assert client.get(f"/v1/streams/gate/snapshots/{frame_index}.jpg").status_code == 404
    assert "snapshot" not in receiver.bodies()[0]


def test_with_a_public_url_bodies_name_the_snapshot_by_a_whole_url(
    make_settings: MakeSettings, clip: Path, receiver: Receiver
) -> None:
    public = "https://vdet.site-7.example/cams"
    settings = make_settings(
        notify={"webhooks": [{"id": "ops", "url": receiver.url}], "public_url": public + "/"},
        sources=[stream_body(clip, "gate", zones=[WHOLE_FRAME])],
    )
    with TestClient(create_app(settings)):
        wait_until(lambda: receiver.requests, 20, what="a webhook delivery")
    body = receiver.bodies()[0]
    assert body["snapshot"] == f"{public}/v1/streams/gate/snapshots/{body['frame_index']}.jpg"


@pytest.mark.parametrize("bad", ["ftp://x", "https://x/?q=1", "https://x/#f", "//x", "https://"])
def test_a_public_url_that_is_not_a_plain_http_address_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="public_url"):
        NotifySettings(public_url=bad)


def test_snapshots_need_the_api_key(make_settings: MakeSettings, clip: Path) -> None:
    settings = make_settings(
        api_key="s3cret-k3y", sources=[stream_body(clip, "gate", zones=[WHOLE_FRAME])]
    )
    with TestClient(create_app(settings)) as client:
        assert client.get("/v1/streams/gate/snapshots").status_code == 401
        assert client.get("/v1/streams/gate/snapshots/1.jpg").status_code == 401
        r = client.get("/v1/streams/gate/snapshots", headers={"X-API-Key": "s3cret-k3y"})
        assert r.status_code == 200


@pytest.mark.parametrize(
    "bad", [{"per_stream": -1}, {"max_width": 8}, {"quality": 0}, {"queue": 0}, {"extra": 1}]
)
def test_settings_out_of_bounds_are_refused(bad: dict[str, int]) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        EventSnapshotSettings.model_validate(bad)
