"""Event clips through the real app (ONNX Runtime's tiny model, a real RTSP server from
GStreamer and a real H.264 file): a zone over the whole frame makes an event, its clip is
written from the camera's own packets and listed with its event, served with range requests
(206, as a browser seeking asks), deleted; with clips off the routes say so."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import av
import pytest
from support.apptest import MakeSettings, TestClient, stream_body
from support.rtsp import RtspServer
from support.waiting import wait_until
from support.webhooks import Receiver

from vdet.api.app import create_app
from vdet.api.routes_clips import byte_range
from vdet.clips.store import ClipStore

WHOLE_FRAME = {"id": "all", "kind": "polygon", "points": [[0, 0], [1, 0], [1, 1], [0, 1]]}


def listing(client: TestClient, stream_id: str = "gate") -> dict[str, Any]:
    r = client.get(f"/v1/streams/{stream_id}/clips")
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def test_an_rtsp_camera_s_event_clip_is_written_listed_served_in_ranges_and_deleted(
    make_settings: MakeSettings,
    clip: Path,
    rtsp_server_factory: Callable[[Path], RtspServer],
    tmp_path: Path,
) -> None:
    camera = rtsp_server_factory(clip)
    settings = make_settings(
        clips={"folder": str(tmp_path / "clips"), "pre_roll_s": 1.0, "post_roll_s": 1.0},
        sources=[{"id": "gate", "url": camera.url, "zones": [WHOLE_FRAME]}],
    )
    with TestClient(create_app(settings)) as client:
        clips = wait_until(lambda: listing(client)["clips"], 30, what="a clip")
        first = clips[0]
        assert first["media_type"] == "video/mp4" and first["codec"] == "h264"
        assert {e["type"] for e in first["events"]} == {"zone_enter"}
        assert first["url"] == f"/v1/streams/gate/clips/{first['clip_id']}"
        whole = client.get(first["url"])
        assert whole.status_code == 200 and whole.headers["content-type"] == "video/mp4"
        assert len(whole.content) == first["bytes"] and whole.headers["accept-ranges"] == "bytes"
        video = tmp_path / "got.mp4"
        video.write_bytes(whole.content)
        with av.open(str(video)) as container:
            frames = list(container.decode(video=0))
        assert frames[0].key_frame and len(frames) == first["frames"]
        # The duration is the video's own (within one frame of what the file decodes to); the
        # arrival times of its first and last packets span about as much, give or take how a
        # loaded machine delivers a live camera's packets (0.43 s once on two busy cores).
        step = float(frames[1].time - frames[0].time)
        decoded = float(frames[-1].time - frames[0].time) + step
        assert abs(first["duration_s"] - decoded) <= step + 1e-6, (first["duration_s"], decoded)
        assert abs(first["duration_s"] - (first["end_time"] - first["start_time"])) <= 1.0

        part = client.get(first["url"], headers={"Range": "bytes=0-99"})
        assert part.status_code == 206 and part.content == whole.content[:100]
        assert part.headers["content-range"] == f"bytes 0-99/{first['bytes']}"
        tail = client.get(first["url"], headers={"Range": "bytes=-64"})
        assert tail.status_code == 206 and tail.content == whole.content[-64:]

        metrics = client.get("/metrics").text
        assert 'vdet_clips_total{outcome="written",source="gate"}' in metrics
        assert listing(client)["failed"] == {}
        assert client.delete(first["url"]).status_code == 204
        assert client.get(first["url"]).status_code == 404
        assert client.delete(first["url"]).status_code == 404
        assert client.get("/v1/streams/gate/clips/not-a-clip").status_code == 422
        assert client.get("/v1/streams/nobody/clips").status_code == 404


def test_with_clips_off_the_routes_say_so(make_settings: MakeSettings, clip: Path) -> None:
    settings = make_settings(sources=[stream_body(clip, "gate", zones=[WHOLE_FRAME])])
    with TestClient(create_app(settings)) as client:
        r = client.get("/v1/streams/gate/clips")
        assert r.status_code == 404 and "clips.folder" in r.json()["detail"]


def test_webhooks_name_a_clip_once_it_is_complete(
    make_settings: MakeSettings, clip: Path, tmp_path: Path
) -> None:
    receiver = Receiver()
    try:
        settings = make_settings(
            clips={"folder": str(tmp_path / "clips"), "pre_roll_s": 0.5, "post_roll_s": 0.5},
            notify={
                "public_url": "https://vdet.example",
                "webhooks": [{"id": "ops", "url": receiver.url, "events": ["zone_enter"]}],
            },
            sources=[stream_body(clip, "gate", zones=[WHOLE_FRAME])],
        )
        with TestClient(create_app(settings)) as client:
            bodies = wait_until(
                lambda: [b for b in receiver.bodies() if "clip" in b], 30, what="a clip message"
            )
            (kept,) = listing(client)["clips"][:1]
        first = bodies[0]
        assert first["source_id"] == "gate" and first["webhook"] == "ops"
        assert first["clip"]["url"] == f"https://vdet.example{kept['url']}"
        assert first["clip"]["clip_id"] == kept["clip_id"]
        assert {e["type"] for e in first["events"]} == {"zone_enter"}
    finally:
        receiver.close()


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, (0, 1000)),
        ("bytes=0-99", (0, 100)),
        ("bytes=900-", (900, 1000)),
        ("bytes=-10", (990, 1000)),
        ("bytes=-5000", (0, 1000)),
        ("bytes=990-5000", (990, 1000)),
        ("bytes=0-1,5-9", (0, 1000)),  # several ranges: answered whole
        ("items=0-5", (0, 1000)),  # another unit: answered whole
    ],
)
def test_a_range_header_names_the_bytes_served(
    header: str | None, expected: tuple[int, int]
) -> None:
    assert byte_range(header, 1000) == expected


@pytest.mark.parametrize(
    "header", ["bytes=1000-", "bytes=5-2", "bytes=-0", "bytes=x-5", "bytes=-", "bytes=1e3-"]
)
def test_a_range_past_the_end_or_malformed_is_not_satisfiable(header: str) -> None:
    with pytest.raises(ValueError, match="range"):
        byte_range(header, 1000)


@pytest.mark.parametrize("stream_id", ["..", ".", "a/b", "", "x" * 65])
def test_the_clips_folder_is_never_left_by_a_stream_id(tmp_path: Path, stream_id: str) -> None:
    (tmp_path / "1000000000000.json").write_text("{}")  # what '..' would find from a subfolder
    store = ClipStore(tmp_path / "clips", 1 << 20, 3600.0)
    assert store.clips(stream_id) == []
    assert store.get(stream_id, "1000000000000") is None
    assert not store.delete(stream_id, "1000000000000")
    assert (tmp_path / "1000000000000.json").exists()
    with pytest.raises(ValueError, match="not a stream id"):
        store.stream_folder(stream_id)
