"""Live video for the web page and other viewers (`live`)."""

from __future__ import annotations

from pydantic import Field

from vdet.config.base import Strict


class LiveSettings(Strict):
    """Live video (GET /v1/streams/{id}/live.mjpeg and the web page's live view)."""

    max_viewers: int = Field(
        default=8,
        ge=0,
        le=256,
        description="Most live video responses open at once, all streams together (each one "
        "costs a JPEG encode per new frame unless another viewer of the same stream and size "
        "shares it); 0 turns live video off.",
    )
    max_fps: float = Field(
        default=15.0, gt=0.0, le=60.0, description="Highest frame rate a viewer may ask for."
    )
    jpeg_quality: int = Field(default=75, ge=20, le=95, description="JPEG quality of live frames.")
    max_width: int = Field(
        default=1280,
        ge=160,
        le=7680,
        description="Live frames wider than this are scaled down to it before encoding.",
    )
    send_timeout_s: float = Field(
        default=5.0,
        ge=0.5,
        le=300.0,
        description="A viewer whose next frame has not gone out after this long (it stopped "
        "reading) is disconnected and its place freed.",
    )
    encoder_threads: int = Field(
        default=2, ge=1, le=32, description="Threads that may encode live frames at once."
    )
