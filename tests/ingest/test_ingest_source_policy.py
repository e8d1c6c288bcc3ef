"""The operator's source policy, FFmpeg's whitelists and credential redaction (vdet.ingest.urls).

Abuse cases: a text file or a playlist must never become a video source, no file outside the
allowed folders may be probed (and the errors must not tell which paths exist), network
sources only reach allowed hosts, and credentials never come back in errors or logs.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import av
import pytest
from support.waiting import wait_until

from vdet.config.ingest import IngestSettings
from vdet.core.assets import asset_path
from vdet.core.redact import redact
from vdet.core.types import SourceState
from vdet.ingest.mailbox import FrameMailbox
from vdet.ingest.reader import SourceReader
from vdet.ingest.source_thread import IngestOptions, SourceThread
from vdet.ingest.urls import REFUSED_FILE, SourcePolicy, ffmpeg_whitelists, validate_source_url

DEFAULT = SourcePolicy()


def test_the_bundled_demo_clip_is_always_allowed() -> None:
    demo = str(asset_path("sample.mp4"))
    assert validate_source_url(demo, DEFAULT) == demo
    assert validate_source_url(demo, SourcePolicy(file_roots=())) == demo


def test_files_outside_the_roots_get_one_message_whatever_they_are(tmp_path: Path) -> None:
    inside, outside = tmp_path / "videos", tmp_path / "elsewhere"
    inside.mkdir()
    outside.mkdir()
    (outside / "clip.mp4").write_bytes(b"x")
    unreadable = inside / "locked.mp4"
    unreadable.write_bytes(b"x")
    unreadable.chmod(0)
    policy = SourcePolicy(file_roots=(inside,))
    cases = [
        outside / "clip.mp4",  # exists, outside
        outside / "missing.mp4",  # missing, outside
        Path("/etc/hostname"),  # a system file
        Path("/etc"),  # a folder
        inside / "missing.mp4",  # missing, inside
        inside,  # the root itself
        inside / ".." / "elsewhere" / "clip.mp4",  # climbing out
        Path("/dev/zero"),
    ]
    if os.geteuid() != 0:  # root reads anything
        cases.append(unreadable)
    messages = set()
    for path in cases:
        for url in (str(path), path.as_uri() if path.is_absolute() else str(path)):
            with pytest.raises(ValueError, match=r"\w") as info:
                validate_source_url(url, policy)
            messages.add(str(info.value))
    assert messages == {REFUSED_FILE}


def test_a_symlink_out_of_a_root_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "videos"
    root.mkdir()
    secret = tmp_path / "secret.mp4"
    secret.write_bytes(b"x")
    (root / "link.mp4").symlink_to(secret)
    (root / "ok.mp4").write_bytes(b"x")
    policy = SourcePolicy(file_roots=(root,))
    with pytest.raises(ValueError, match=REFUSED_FILE):
        validate_source_url(str(root / "link.mp4"), policy)
    assert validate_source_url(str(root / "ok.mp4"), policy) == str(root / "ok.mp4")


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("rtsp://10.1.2.3/s", True),
        ("rtsp://user:pw@10.1.2.3:554/s", True),
        ("rtsp://10.2.0.1/s", False),
        ("http://127.0.0.1:8080/x", False),
        ("http://[::1]/x", False),
        ("http://[fd00::7]/x", True),
        ("rtsp://cam.local/s", True),
        ("rtsp://CAM.LOCAL./s", True),
        ("rtsp://evil.cam.local.attacker.example/s", False),
        ("rtsp://a.cams.example/s", True),
        ("rtsp://cams.example/s", False),
        ("https://metadata.google.internal/", False),
    ],
)
def test_hosts_are_checked_against_names_and_networks(url: str, allowed: bool) -> None:
    policy = SourcePolicy(hosts=("10.1.0.0/16", "fd00::/8", "cam.local", "*.cams.example"))
    if allowed:
        assert validate_source_url(url, policy) == url
    else:
        with pytest.raises(ValueError, match="not allowed on this server"):
            validate_source_url(url, policy)


def test_schemes_can_be_narrowed() -> None:
    policy = SourcePolicy(schemes=("rtsps",))
    assert validate_source_url("rtsps://cam/s", policy) == "rtsps://cam/s"
    for url in ("rtsp://cam/s", "http://cam/x", str(asset_path("sample.mp4"))):
        with pytest.raises(ValueError, match="not allowed on this server"):
            validate_source_url(url, policy)


def test_settings_build_the_policy_and_reject_junk() -> None:
    ingest = IngestSettings(
        source_policy={"schemes": ["rtsp"], "hosts": ["10.0.0.0/8"], "file_roots": ["/srv"]}
    )
    policy = IngestOptions.of(ingest, loop_files=False, realtime=False).policy
    assert policy == SourcePolicy(
        schemes=("rtsp",), hosts=("10.0.0.0/8",), file_roots=(Path("/srv"),)
    )
    with pytest.raises(ValueError, match="schemes"):
        IngestSettings(source_policy={"schemes": ["ftp"]})
    with pytest.raises(ValueError, match="nope"):
        IngestSettings(source_policy={"nope": 1})


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("readme.nfo", b"Hello, this is a private text file.\nSecond line.\n"),
        ("art.ans", b"\x1b[31mred text\x1b[0m\n"),
        ("notes.asc", b"-----BEGIN PGP MESSAGE-----\nabc\n"),
        ("list.m3u8", b"#EXTM3U\n#EXTINF:1,\nfile:///etc/hostname\n"),
        ("list.ffconcat", b"ffconcat version 1.0\nfile /etc/hostname\n"),
        ("x.srt", b"1\n00:00:00,000 --> 00:00:01,000\nsubtitle\n"),
    ],
)
def test_text_files_and_playlists_never_become_sources(
    tmp_path: Path, name: str, content: bytes
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    reader = SourceReader(str(path), source_id="t")
    with pytest.raises((av.FFmpegError, OSError, ValueError)):
        reader.open()
    reader.close()


def test_a_real_clip_still_opens_under_the_whitelists(h264_clip: Path) -> None:
    with SourceReader(str(h264_clip), source_id="t") as reader:
        assert reader.open().width == 640
    assert "mov" in ffmpeg_whitelists(str(h264_clip))["format_whitelist"]
    assert ffmpeg_whitelists(str(h264_clip))["protocol_whitelist"] == "file"
    assert ffmpeg_whitelists("rtsp://cam/s")["protocol_whitelist"] == "rtsp,tcp,udp"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("rtsp://admin:s3cret@10.0.0.7/s", "rtsp://***@10.0.0.7/s"),
        ("rtsp://admin:p@ss@10.0.0.7/s", "rtsp://***@10.0.0.7/s"),
        (
            "failed: 'http://u@h:80/x?y=1' and RTSPS://a:b@c/",
            "failed: 'http://***@h:80/x?y=1' and RTSPS://***@c/",
        ),
        ("rtsp://cam/path@with-at", "rtsp://cam/path@with-at"),
        ("no url here", "no url here"),
    ],
)
def test_credentials_are_redacted(text: str, expected: str) -> None:
    assert redact(text) == expected


def test_credentials_never_reach_last_error_or_logs(caplog: pytest.LogCaptureFixture) -> None:
    # Nothing listens on port 9 of localhost: the connection fails with an error naming the URL.
    url = "rtsp://admin:hunter22@127.0.0.1:9/stream"
    options = IngestOptions(
        connect_timeout_s=1.0, read_timeout_s=1.0, backoff_initial_s=5.0, backoff_max_s=5.0
    )
    worker = SourceThread("cam", url, FrameMailbox(), options)
    with caplog.at_level(logging.DEBUG):
        worker.start()
        try:
            wait_until(lambda: worker.state is SourceState.BACKOFF, 10, what="a failed attempt")
        finally:
            worker.stop()
    status = worker.status()
    assert status.last_error
    shown = [status.last_error, *status.history, caplog.text]
    assert not any("hunter22" in text for text in shown)
