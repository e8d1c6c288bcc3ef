from __future__ import annotations

import os
from pathlib import Path

import pytest

from vdet.ingest.urls import is_network_url, validate_source_url


@pytest.mark.parametrize(
    "url",
    [
        "rtsp://192.168.1.10:554/stream1",
        "RTSP://cam.local/live",
        "rtsp://user:secret@10.0.0.5/h264?channel=1",
        "rtsps://cam.example.com:322/stream",
        "http://127.0.0.1:8080/video.mjpg",
        "https://example.com/live/index.m3u8",
        "rtsp://[::1]:8554/cam",
    ],
)
def test_network_urls_are_accepted_unchanged(url: str) -> None:
    assert validate_source_url(url) == url
    assert validate_source_url(f"  {url}\n") == url
    assert is_network_url(url)


@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.com/clip.mp4",
        "udp://239.0.0.1:1234",
        "rtmp://example.com/live",
        "concat:/etc/passwd|/etc/hosts",
        "pipe:0",
        "data:video/mp4;base64,AAAA",
        "javascript:alert(1)",
    ],
)
def test_other_schemes_are_rejected_naming_the_allowed_ones(url: str) -> None:
    with pytest.raises(ValueError, match="unsupported source scheme") as info:
        validate_source_url(url)
    for scheme in ("rtsp://", "rtsps://", "http://", "https://", "file://"):
        assert scheme in str(info.value)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("rtsp://", "no host"),
        ("rtsp:///stream", "no host"),
        ("http:example.com/x", "must look like"),
        ("rtsp://cam:99999/x", "invalid port"),
        ("rtsp://cam:abc/x", "invalid port"),
        ("rtsp://cam/\x00x", "control characters"),
        ("file://otherhost/clip.mp4", "local file"),
    ],
)
def test_malformed_urls_are_rejected(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate_source_url(url)


def test_existing_file_paths_come_back_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clip = tmp_path / "my clip.mp4"
    clip.write_bytes(b"x")
    monkeypatch.chdir(tmp_path)
    assert validate_source_url(str(clip)) == str(clip)
    assert validate_source_url("my clip.mp4") == str(clip)
    assert validate_source_url("./my clip.mp4") == str(clip)
    assert validate_source_url(clip.as_uri()) == str(clip)  # file:///.../my%20clip.mp4
    assert validate_source_url(f"file://localhost{clip}") == str(clip)
    assert not is_network_url(str(clip))
    assert os.path.isabs(validate_source_url("my clip.mp4"))


@pytest.mark.parametrize("form", ["path", "uri"])
def test_missing_files_are_rejected(tmp_path: Path, form: str) -> None:
    missing = tmp_path / "missing.mp4"
    url = str(missing) if form == "path" else missing.as_uri()
    with pytest.raises(ValueError, match="does not exist"):
        validate_source_url(url)


def test_a_directory_is_not_a_source(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a regular file"):
        validate_source_url(str(tmp_path))


def test_ffmpeg_protocol_syntax_in_a_path_can_only_name_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # FFmpeg reads "subfile,,start,0,end,9,,:x" as its subfile protocol; as an absolute path it
    # can only be a file of that name.
    monkeypatch.chdir(tmp_path)
    name = "subfile,,start,0,end,9,,:x"
    with pytest.raises(ValueError, match="does not exist"):
        validate_source_url(name)
    (tmp_path / name).write_bytes(b"x")
    assert validate_source_url(name) == str(tmp_path / name)
