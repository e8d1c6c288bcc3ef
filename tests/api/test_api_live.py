"""Live MJPEG video and the web page's files, over a real uvicorn server and real sockets.

An endless multipart response needs a server that streams (the in-process test client
buffers whole bodies), so each test runs the app in uvicorn on a thread, with the tiny model
on the short H.264 clip.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import httpx
import numpy as np
import pytest
import uvicorn
from support.apptest import CLIP_WH, MakeSettings, expected_box, stream_body
from support.rtsp import free_port
from support.videos import write_h264_clip
from support.waiting import wait_until

from vdet.api.app import create_app


@dataclass
class LiveServer:
    base_url: str
    client: httpx.Client

    def metric(self, name: str) -> float:
        text = self.client.get("/metrics").text
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise AssertionError(f"no metric {name}")


@pytest.fixture
def serve(make_settings: MakeSettings) -> Iterator[Any]:
    servers: list[tuple[uvicorn.Server, threading.Thread, httpx.Client]] = []

    def start(headers: dict[str, str] | None = None, **overrides: Any) -> LiveServer:
        port = free_port()
        app = create_app(make_settings(**overrides))
        config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        wait_until(lambda: server.started, 20, what="uvicorn to start")
        base = f"http://127.0.0.1:{port}"
        client = httpx.Client(base_url=base, headers=headers or {}, timeout=10)
        servers.append((server, thread, client))
        return LiveServer(base, client)

    yield start
    for server, thread, client in servers:
        client.close()
        server.should_exit = True
        thread.join(timeout=20)


@dataclass
class Part:
    headers: dict[str, str]
    jpeg: bytes

    @property
    def image(self) -> np.ndarray[Any, Any]:
        image = cv2.imdecode(np.frombuffer(self.jpeg, np.uint8), cv2.IMREAD_COLOR)
        assert image is not None
        return image


class PartReader:
    """Reads the parts of a multipart/x-mixed-replace body one at a time.

    One byte iterator for the whole response: dropping an httpx iterator closes the stream.
    """

    def __init__(self, response: httpx.Response) -> None:
        self.boundary = "--" + response.headers["content-type"].split("boundary=")[1]
        self._chunks = response.iter_bytes()
        self._buffer = b""

    def read(self, count: int) -> list[Part]:
        parts: list[Part] = []
        while len(parts) < count:
            buffer = self._buffer
            head_end = buffer.find(b"\r\n\r\n")
            if head_end >= 0:
                lines = buffer[:head_end].decode("ascii").split("\r\n")
                assert lines[0] == self.boundary
                headers = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
                length = int(headers["content-length"])
                start = head_end + 4
                if len(buffer) >= start + length + 2:
                    parts.append(Part(headers, buffer[start : start + length]))
                    assert buffer[start + length : start + length + 2] == b"\r\n"
                    self._buffer = buffer[start + length + 2 :]
                    continue
            self._buffer += next(self._chunks)
        return parts


def read_parts(response: httpx.Response, count: int) -> list[Part]:
    """The first `count` parts of a response read with no other reader."""
    return PartReader(response).read(count)


def drawn_difference(with_boxes: Part, without: Part) -> tuple[float, float]:
    """Mean |difference| of two encodes of one frame along the person box's left edge, and
    in the bottom-left JPEG blocks, away from every box and label."""
    assert with_boxes.headers["x-vdet-frame"] == without.headers["x-vdet-frame"]
    diff = np.abs(with_boxes.image.astype(int) - without.image.astype(int))
    x1, y1, _, y2 = (round(v) for v in expected_box(0))
    return float(diff[y1 + 2 : y2 - 2, x1].mean()), float(diff[88:, :40].mean())


def add_clip(server: LiveServer, clip: Path, stream_id: str = "cam") -> None:
    r = server.client.post("/v1/streams", json=stream_body(clip, stream_id))
    assert r.status_code == 201, r.text


def frame_numbers(parts: list[Part]) -> list[tuple[int, int, int]]:
    """Each part's (X-Vdet-Frame, X-Vdet-Result-Frame, X-Vdet-Seq)."""
    return [
        (
            int(p.headers["x-vdet-frame"]),
            int(p.headers["x-vdet-result-frame"]),
            int(p.headers["x-vdet-seq"]),
        )
        for p in parts
    ]


def test_live_video_sends_new_frames_with_their_seq_and_boxes(serve: Any, clip: Path) -> None:
    server = serve()
    add_clip(server, clip)
    with server.client.stream("GET", "/v1/streams/cam/live.mjpeg", params={"fps": 15}) as r:
        assert r.status_code == 200
        assert r.headers["content-type"] == "multipart/x-mixed-replace; boundary=vdetframe"
        assert r.headers["cache-control"] == "no-store"
        reader = PartReader(r)
        parts = reader.read(4)
        assert server.metric("vdet_live_viewers") == 1
    numbers = frame_numbers(parts)
    pictures = [(frame, result) for frame, result, _ in numbers]
    assert len(set(pictures)) == len(pictures), "each picture once"
    assert [frame for frame, _, _ in numbers] == sorted(frame for frame, _, _ in numbers)
    assert all(result <= frame for frame, result, _ in numbers), "results of earlier frames"
    seqs = [seq for _, _, seq in numbers]
    assert seqs == sorted(seqs) and seqs[0] >= 1
    assert all(p.headers["x-vdet-source-size"] == f"{CLIP_WH[0]}x{CLIP_WH[1]}" for p in parts)
    image = parts[-1].image
    assert image.shape == (CLIP_WH[1], CLIP_WH[0], 3)
    wait_until(lambda: server.metric("vdet_live_viewers") == 0, 10, what="the viewer to leave")
    assert server.metric("vdet_live_frames_sent_total") >= 4


@pytest.fixture(scope="module")
def slow_clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """5 frames a second: viewers asking for 15 get every frame, so they see the same ones."""
    folder = tmp_path_factory.mktemp("slow")
    return write_h264_clip(folder / "slow.mp4", seconds=2.0, fps=5, size_wh=CLIP_WH)


def test_boxes_are_drawn_on_request_and_frames_never_scaled_up(serve: Any, slow_clip: Path) -> None:
    server = serve()
    add_clip(server, slow_clip)
    url = "/v1/streams/cam/live.mjpeg"
    plain = {"fps": 15, "boxes": "false", "max_width": 160}
    with (
        server.client.stream("GET", url, params={"fps": 15}) as a,
        server.client.stream("GET", url, params=plain) as b,
    ):
        boxed = {p.headers["x-vdet-frame"]: p for p in PartReader(a).read(4)}
        bare = {p.headers["x-vdet-frame"]: p for p in PartReader(b).read(4)}
    common = sorted(set(boxed) & set(bare), key=int)
    assert common, "the two viewers saw no frame in common"
    frame = bare[common[-1]]
    assert frame.image.shape == (CLIP_WH[1], CLIP_WH[0], 3)  # 160 > 128: not scaled up
    on_edge, elsewhere = drawn_difference(boxed[common[-1]], frame)
    assert on_edge > 10 and on_edge > 4 * elsewhere, (on_edge, elsewhere)


def test_the_live_width_setting_scales_frames_down(
    serve: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    server = serve(live={"max_width": 160})
    wide = write_h264_clip(
        tmp_path_factory.mktemp("wide") / "wide.mp4", seconds=1.0, fps=30, size_wh=(320, 240)
    )
    add_clip(server, wide)
    with server.client.stream("GET", "/v1/streams/cam/live.mjpeg") as r:
        (part,) = read_parts(r, 1)
    assert part.image.shape == (120, 160, 3)
    assert part.headers["x-vdet-source-size"] == "320x240"


def test_viewers_of_one_picture_share_its_encodes(serve: Any, slow_clip: Path) -> None:
    server = serve()
    add_clip(server, slow_clip)
    url = "/v1/streams/cam/live.mjpeg"
    with (
        server.client.stream("GET", url, params={"fps": 15}) as a,
        server.client.stream("GET", url, params={"fps": 15}) as b,
    ):
        seen_a = frame_numbers(PartReader(a).read(5))
        seen_b = frame_numbers(PartReader(b).read(5))
        encodes = server.metric("vdet_live_encode_seconds_count")
    shared = set(seen_a) & set(seen_b)
    assert len(shared) >= 3, (seen_a, seen_b)
    # One encode per distinct picture, however many viewers received it (+1: a newer one may
    # have been encoded and not sent yet).
    assert encodes <= len(set(seen_a) | set(seen_b)) + 1


def test_processed_frames_come_with_their_own_result(serve: Any, clip: Path) -> None:
    server = serve()
    add_clip(server, clip)
    url = "/v1/streams/cam/live.mjpeg"
    with server.client.stream("GET", url, params={"fps": 30, "frames": "processed"}) as r:
        numbers = frame_numbers(PartReader(r).read(4))
    assert all(frame == result for frame, result, _ in numbers), numbers
    seqs = [seq for _, _, seq in numbers]
    assert seqs == sorted(set(seqs)), "each processed frame once, in order"
    assert server.client.get(url, params={"frames": "all"}).status_code == 422


def test_viewer_cap_fps_cap_and_unknown_stream(serve: Any, clip: Path) -> None:
    server = serve(live={"max_viewers": 1, "max_fps": 10})
    add_clip(server, clip)
    url = "/v1/streams/cam/live.mjpeg"
    for bad in ({"fps": 0}, {"fps": 61}, {"max_width": 100}, {"boxes": "maybe"}):
        assert server.client.get(url, params=bad).status_code == 422, bad
    assert server.client.get("/v1/streams/nope/live.mjpeg").status_code == 404
    with server.client.stream("GET", url) as first:
        first_reader = PartReader(first)
        first_reader.read(1)
        second = server.client.get(url)
        assert second.status_code == 503
        assert "live.max_viewers" in second.json()["detail"]
        assert second.headers["retry-after"] == "5"
    # The slot is free again once the first viewer has gone.
    wait_until(lambda: server.metric("vdet_live_viewers") == 0, 10, what="the slot to free")
    with server.client.stream("GET", url) as again:
        assert again.status_code == 200


def test_viewers_that_stop_reading_are_dropped_and_their_places_freed(
    serve: Any, clip: Path
) -> None:
    """Two viewers take both places and read nothing (a small receive window, never read):
    once a frame has waited live.send_timeout_s to go out, each is dropped, and a real
    viewer gets in."""
    server = serve(live={"max_viewers": 2, "send_timeout_s": 0.5, "max_fps": 30})
    add_clip(server, clip)
    host, port = server.base_url.removeprefix("http://").split(":")
    idle = []
    for _ in range(2):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
        sock.connect((host, int(port)))
        sock.sendall(
            b"GET /v1/streams/cam/live.mjpeg?fps=30&max_width=1280 HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        idle.append(sock)
    try:
        wait_until(lambda: server.metric("vdet_live_viewers") == 2, 10, what="both to watch")
        assert server.client.get("/v1/streams/cam/live.mjpeg").status_code == 503
        wait_until(
            lambda: server.metric("vdet_live_viewers") == 0, 60, what="the idle viewers to go"
        )
        with server.client.stream("GET", "/v1/streams/cam/live.mjpeg") as viewer:
            assert viewer.status_code == 200
            PartReader(viewer).read(2)
    finally:
        for sock in idle:
            sock.close()


def test_removing_the_stream_ends_its_live_video(serve: Any, clip: Path) -> None:
    server = serve()
    add_clip(server, clip)
    with server.client.stream("GET", "/v1/streams/cam/live.mjpeg") as r:
        reader = PartReader(r)
        reader.read(1)
        other = httpx.Client(base_url=server.base_url, timeout=10)
        assert other.delete("/v1/streams/cam").status_code == 204
        other.close()
        started = time.monotonic()
        with pytest.raises(StopIteration):
            reader.read(1000)  # the body ends
        assert time.monotonic() - started < 5


def test_live_video_needs_the_api_key(serve: Any, clip: Path) -> None:
    key = "live-test-key-123"
    server = serve(headers={"X-API-Key": key}, api_key=key)
    add_clip(server, clip)
    anonymous = httpx.get(f"{server.base_url}/v1/streams/cam/live.mjpeg", timeout=10)
    assert anonymous.status_code == 401
    bearer = {"Authorization": f"Bearer {key}"}
    url = f"{server.base_url}/v1/streams/cam/live.mjpeg"
    with httpx.stream("GET", url, headers=bearer, timeout=10) as r:
        assert r.status_code == 200
        read_parts(r, 1)
    # The page itself is public: it holds no data and asks for the key.
    page = httpx.get(f"{server.base_url}/", timeout=10)
    assert page.status_code == 200


def test_the_page_and_its_files_are_small_and_locked_down(serve: Any) -> None:
    server = serve()
    page = server.client.get("/")
    assert page.status_code == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    csp = page.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
    total = len(page.content)
    for name, media_type in (("app.js", "text/javascript"), ("app.css", "text/css")):
        r = server.client.get(f"/ui/{name}")
        assert r.status_code == 200 and r.headers["content-type"].startswith(media_type)
        assert f"/ui/{name}" in page.text
        total += len(r.content)
    assert total < 200_000  # the first load, uncompressed; the target is 200 KB transferred
    for bad in ("/ui/secret.txt", "/ui/..%2Fapi%2Fapp.py", "/ui/%2E%2E"):
        assert server.client.get(bad).status_code == 404
    assert "/ui/{name}" not in server.client.get("/openapi.json").text
