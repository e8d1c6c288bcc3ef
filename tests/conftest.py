"""Fixtures shared across test packages; helpers live in tests/support/ and are exposed here.

Keep this file to imports and small fixtures so that every package can add its own.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.rtsp import rtsp_server_factory
from support.videos import write_h264_clip

__all__ = ["h264_bframes_clip", "h264_clip", "rtsp_server_factory", "tracking_compiled"]


@pytest.fixture(scope="session")
def h264_clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """640x360, 30 fps, 4 s (120 frames), H.264 without B-frames, keyframe every second."""
    return write_h264_clip(tmp_path_factory.mktemp("clips") / "plain.mp4")


@pytest.fixture(scope="session")
def h264_bframes_clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Like `h264_clip` but with 2 B-frames, so decode order differs from display order."""
    return write_h264_clip(tmp_path_factory.mktemp("clips") / "bframes.mp4", bframes=2)


@pytest.fixture(scope="session", autouse=True)
def tracking_compiled() -> None:
    """Tracking's Numba loops compiled (or loaded from the cache, under a second) once, first:
    compiling cold takes tens of seconds, which would otherwise fall on the first frame of
    whichever test's stream came first and outlast its timeouts."""
    from vdet.tracking import compiled

    compiled.warm_up()
