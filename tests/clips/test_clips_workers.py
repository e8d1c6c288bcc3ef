"""Event clips with stream worker processes, as users run them: the installed `vdet serve` on
the CPU backend with two worker processes, a real H.264 file added over REST with a zone over
the whole frame. The worker that runs the stream writes its clips into the clips folder; the
API process lists and serves them and announces each to a webhook."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.apptest import CLIP_WH, write_tiny_model
from support.procs import http_get
from support.serve import Service, start_service
from support.videos import decode_video_bytes, write_h264_clip
from support.waiting import wait_until
from support.webhooks import Receiver

pytestmark = pytest.mark.slow

WHOLE_FRAME = {"id": "all", "kind": "polygon", "points": [[0, 0], [1, 0], [1, 1], [0, 1]]}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("clip_workers")


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture(scope="module")
def service(folder: Path, receiver: Receiver) -> Iterator[Service]:
    svc = start_service(
        folder,
        write_tiny_model(folder / "tiny.onnx"),
        workers={"processes": 2, "streams_per_process": 2, "spares": 0},
        clips={"folder": str(folder / "clips"), "pre_roll_s": 0.5, "post_roll_s": 0.5},
        notify={"webhooks": [{"id": "ops", "url": receiver.url}]},
    )
    try:
        yield svc
    finally:
        svc.process.stop()


def test_a_worker_s_clip_is_listed_served_and_announced_by_the_api(
    service: Service, folder: Path, receiver: Receiver
) -> None:
    clip = write_h264_clip(folder / "cam.mp4", seconds=2.0, fps=15, size_wh=CLIP_WH)
    body = {"id": "gate", "url": str(clip), "loop": True, "realtime": True, "zones": [WHOLE_FRAME]}
    status, _ = service.send("POST", "/v1/streams", body)
    assert status == 201
    listed = wait_until(
        lambda: service.get("/v1/streams/gate/clips")[1]["clips"], 30, what="a clip"
    )
    first = listed[0]
    status, video = http_get(service.base + first["url"], timeout=10)
    assert status == 200 and len(video) == first["bytes"]
    frames = decode_video_bytes(video)
    assert frames[0].key_frame and len(frames) == first["frames"]
    announced = wait_until(
        lambda: [b for b in receiver.bodies() if "clip" in b], 15, what="the clip's message"
    )
    assert (
        announced[0]["clip"]["url"] == f"/v1/streams/gate/clips/{announced[0]['clip']['clip_id']}"
    )
