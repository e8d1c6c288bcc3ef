"""Redirects of network sources held to the source policy, hop by hop, against real servers
on loopback addresses (127.0.0.1 allowed, 127.0.0.2 not): a refused target is never
contacted, an allowed one is followed (vdet.ingest.redirects)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import av
import pytest
from support.redirecting import Listener, http_server, rtsp_redirector
from support.rtsp import RtspServer
from support.videos import write_h264_clip

from vdet.ingest.reader import SourceReader
from vdet.ingest.redirects import RedirectError, check_redirect
from vdet.ingest.urls import SourcePolicy

LOCKED = SourcePolicy(hosts=("127.0.0.1",))


@pytest.fixture
def outsider() -> Iterator[Listener]:
    """A host the policy does not allow, recording whether anyone connected."""
    listener = Listener("127.0.0.2")
    yield listener
    listener.close()


@pytest.fixture(scope="module")
def faststart_clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 s, a keyframe every 5 frames: over HTTP the frames read while probing are dropped
    (fflags nobuffer), and with them the first group of pictures."""
    folder = tmp_path_factory.mktemp("redirects")
    return write_h264_clip(
        folder / "clip.mp4", seconds=2.0, size_wh=(160, 96), gop=5, faststart=True
    )


def first_frames(url: str, policy: SourcePolicy | None, count: int = 3) -> int:
    reader = SourceReader(url, connect_timeout_s=3, read_timeout_s=3, policy=policy)
    try:
        reader.open()
        frames = 0
        for _ in zip(range(count), reader.frames(), strict=False):
            frames += 1
        return frames
    finally:
        reader.close()


@pytest.mark.parametrize(
    ("source", "location", "why"),
    [
        ("http://127.0.0.1/a", "http://127.0.0.2/b", "not allowed"),
        ("http://127.0.0.1/a", "http://localhost/b", "not allowed"),
        ("http://127.0.0.1/a", "http://[::1]/b", "not allowed"),
        ("https://127.0.0.1/a", "http://127.0.0.1/b", "leaves TLS"),
        ("rtsps://127.0.0.1/a", "rtsp://127.0.0.1/b", "leaves TLS"),
        ("http://127.0.0.1/a", "rtsp://127.0.0.1/b", "not a http URL"),
        ("rtsp://127.0.0.1/a", "file:///etc/passwd", "not a rtsp URL"),
        ("http://127.0.0.1/a", "data:video/mp4;base64,AAAA", "not a http URL"),
    ],
)
def test_a_redirect_target_is_held_to_the_policy(source: str, location: str, why: str) -> None:
    with pytest.raises(RedirectError, match=why):
        check_redirect(source, location, LOCKED)


def test_allowed_targets_and_relative_locations_pass() -> None:
    assert check_redirect("http://127.0.0.1/a/b", "c.ts", LOCKED) == "http://127.0.0.1/a/c.ts"
    assert check_redirect("http://127.0.0.1/a", "https://127.0.0.1:8443/x", LOCKED).startswith(
        "https://127.0.0.1:8443"
    )
    assert check_redirect("rtsp://cam/a", "rtsps://other/x", SourcePolicy()) == "rtsps://other/x"


def test_an_http_redirect_to_a_refused_host_is_never_contacted(outsider: Listener) -> None:
    url = http_server("127.0.0.1", lambda _: (302, f"http://127.0.0.2:{outsider.port}/x", None))
    with pytest.raises(RedirectError, match=r"127\.0\.0\.2.*not allowed"):
        first_frames(url + "/video", LOCKED)
    assert outsider.connections == 0


def test_an_http_redirect_to_an_allowed_host_is_followed(faststart_clip: Path) -> None:
    target = http_server("127.0.0.1", lambda _: (200, None, faststart_clip))
    hops = http_server(
        "127.0.0.1", lambda p: (302, target + "/clip.mp4", None) if p == "/b" else (301, "/b", None)
    )
    assert first_frames(hops + "/a", LOCKED) == 3  # two hops: relative, then to another port
    with pytest.raises(RedirectError, match="max_redirects"):
        first_frames(hops + "/a", SourcePolicy(hosts=("127.0.0.1",), max_redirects=1))


def test_a_redirect_loop_ends_at_max_redirects() -> None:
    url = http_server("127.0.0.1", lambda p: (302, p + "x", None))
    with pytest.raises(RedirectError, match="more than 3 redirect"):
        first_frames(url + "/a", LOCKED)


def test_without_a_policy_ffmpeg_follows_http_redirects_itself(faststart_clip: Path) -> None:
    target = http_server("127.0.0.1", lambda _: (200, None, faststart_clip))
    hop = http_server("127.0.0.1", lambda _: (302, target + "/clip.mp4", None))
    assert first_frames(hop + "/a", None) == 3


def test_an_rtsp_redirect_to_a_refused_host_is_never_contacted(outsider: Listener) -> None:
    url = rtsp_redirector("127.0.0.1", f"rtsp://127.0.0.2:{outsider.port}/cam")
    for _ in range(2):  # and again on a reconnect
        with pytest.raises(RedirectError, match=r"127\.0\.0\.2.*not allowed"):
            first_frames(url, LOCKED)
    assert outsider.connections == 0


def test_an_rtsp_redirect_to_an_allowed_camera_is_followed_through_the_relay(
    rtsp_server_factory: Callable[[Path], RtspServer], faststart_clip: Path
) -> None:
    camera = rtsp_server_factory(faststart_clip)
    url = rtsp_redirector("127.0.0.1", camera.url)
    assert first_frames(url, LOCKED, count=10) == 10
    with pytest.raises(RedirectError, match="max_redirects"):
        first_frames(url, SourcePolicy(hosts=("127.0.0.1",), max_redirects=0))
    # Without host restrictions FFmpeg connects (and follows) itself: every host is allowed.
    assert first_frames(url, SourcePolicy(), count=10) == 10


def test_the_relay_passes_a_camera_through_whole(
    rtsp_server_factory: Callable[[Path], RtspServer], faststart_clip: Path
) -> None:
    camera = rtsp_server_factory(faststart_clip)
    assert first_frames(camera.url, LOCKED, count=60) == 60
    with pytest.raises(av.FFmpegError):
        first_frames(camera.url.replace("/cam", "/nothing"), LOCKED)
