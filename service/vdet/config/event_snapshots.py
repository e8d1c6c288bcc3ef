"""JPEGs of the frames whose results carried zone or line events (`event_snapshots`)."""

from __future__ import annotations

from pydantic import Field

from vdet.config.base import Strict


class EventSnapshotSettings(Strict):
    """JPEGs of the frames whose results carried zone or line events
    (vdet.streams.event_snapshots)."""

    per_stream: int = Field(
        default=20,
        ge=0,
        le=1000,
        description="Event snapshots kept per stream, the newest; older ones are dropped. "
        "0: none are taken.",
    )
    max_width: int = Field(
        default=1280,
        ge=64,
        le=7680,
        description="Frames wider than this are scaled down to it (never up) before encoding.",
    )
    quality: int = Field(default=80, ge=1, le=100, description="JPEG quality.")
    queue: int = Field(
        default=4,
        ge=1,
        le=64,
        description="Event frames waiting to be encoded; an event frame beyond that gets no "
        "snapshot (counted as skipped). Each waiting frame holds its decoded picture.",
    )
