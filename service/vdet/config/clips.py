"""Event clips (`clips`): a few seconds of a camera's own video around its zone and line
events, remuxed without re-encoding, kept in a folder with limits (vdet.clips)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from vdet.config.base import MiB
from vdet.config.notify import EventFilterSettings

GiB = 1024 * MiB


class ClipSettings(EventFilterSettings):
    """Where clips go, how long they run and how much they may keep; which events make one
    (the filters as for webhooks: every filter given must hold)."""

    folder: Path | None = Field(
        default=None,
        description="Folder the clips are written to (one subfolder per stream), by every "
        "process that runs streams; null: no clips.",
        examples=["/var/lib/vdet/clips"],
    )
    pre_roll_s: float = Field(
        default=5.0,
        ge=0.0,
        le=60.0,
        description="Seconds of video before an event; the clip starts at the last keyframe "
        "at or before then (a clip can only start on a keyframe).",
    )
    post_roll_s: float = Field(
        default=5.0, ge=0.0, le=60.0, description="Seconds of video after the last event."
    )
    max_clip_s: float = Field(
        default=60.0,
        ge=1.0,
        le=3600.0,
        description="Longest clip, from its first frame: events that keep coming extend one "
        "clip up to this long, then the next event starts another. More than pre_roll_s + "
        "post_roll_s.",
    )
    ring_max_bytes: int = Field(
        default=16 * MiB,
        ge=MiB,
        le=1024 * MiB,
        description="Most memory one stream's ring of recent packets (the pre-roll) may hold; "
        "whole groups of pictures are dropped from its old end beyond it.",
    )
    max_total_bytes: int = Field(
        default=2 * GiB,
        ge=MiB,
        le=100_000 * GiB,
        description="Most disk the clips of all streams may take; the oldest are deleted first.",
    )
    max_age_s: float = Field(
        default=7 * 86400.0,
        ge=60.0,
        le=10 * 365 * 86400.0,
        description="Clips that started longer ago than this are deleted.",
    )
    queue: int = Field(
        default=8,
        ge=1,
        le=256,
        description="Finished clips waiting to be written; one finished while it is full is "
        'dropped and counted (`vdet_clip_failures_total{reason="busy"}`).',
    )

    @model_validator(mode="after")
    def _room_for_an_event(self) -> ClipSettings:
        if self.max_clip_s <= self.pre_roll_s + self.post_roll_s:
            raise ValueError(
                f"max_clip_s ({self.max_clip_s}) must be more than pre_roll_s + post_roll_s "
                f"({self.pre_roll_s} + {self.post_roll_s}): a clip holds both around its event"
            )
        return self
