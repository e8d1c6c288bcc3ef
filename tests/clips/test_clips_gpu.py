"""Event clips on the GPU path, as users run it: `vdet serve` with the demo model on torch in two
worker processes, NVDEC decode, the bundled 1080p clip looping with a zone over the whole
frame. The NVDEC reader demuxes with PyAV like the CPU reader, so the same packets reach the
recorder; the clip is written by the worker that owns the stream and served by the API.
Needs a CUDA GPU, PyNvVideoCodec, PyAV, onnx2torch and cuda-python (skipped otherwise)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    pytest.importorskip("PyNvVideoCodec")
pytest.importorskip("av")
pytest.importorskip("onnx2torch")
pytest.importorskip("cuda.bindings")

from support.procs import http_get  # noqa: E402
from support.serve import Service, start_service  # noqa: E402
from support.tools import REPO  # noqa: E402
from support.videos import decode_video_bytes  # noqa: E402
from support.waiting import wait_until  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

DEMO = REPO / "service" / "vdet" / "assets" / "demo.onnx"
SAMPLE = REPO / "service" / "vdet" / "assets" / "sample.mp4"
WHOLE_FRAME = {"id": "all", "kind": "polygon", "points": [[0, 0], [1, 0], [1, 1], [0, 1]]}


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    folder = tmp_path_factory.mktemp("gpu_clips")
    svc = start_service(
        folder,
        DEMO,
        ready_timeout=300,
        backend="torch",
        workers={"processes": 2, "streams_per_process": 2},
        clips={
            "folder": str(folder / "clips"),
            "pre_roll_s": 2.0,
            "post_roll_s": 2.0,
            "max_clip_s": 6.0,
        },
    )
    try:
        yield svc
    finally:
        svc.process.stop()


def test_a_clip_of_an_nvdec_stream_in_a_worker_decodes_whole(service: Service) -> None:
    body = {"id": "g0", "url": str(SAMPLE), "loop": True, "realtime": True, "zones": [WHOLE_FRAME]}
    status, _ = service.send("POST", "/v1/streams", body)
    assert status == 201
    listed = wait_until(lambda: service.get("/v1/streams/g0/clips")[1]["clips"], 60, what="a clip")
    first = listed[0]
    assert first["codec"] == "h264" and first["frames"] > 30
    status, video = http_get(service.base + first["url"], timeout=20)
    assert status == 200 and len(video) == first["bytes"]
    frames = decode_video_bytes(video)
    assert frames[0].key_frame and len(frames) == first["frames"]
    assert (frames[0].width, frames[0].height) == (1920, 1080)
