"""How sources are opened, read, watched and reconnected (`ingest`), and which sources may be
added at all (`ingest.source_policy`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, get_args

from pydantic import Field, model_validator

from vdet.config.base import Strict

SourceScheme = Literal["rtsp", "rtsps", "http", "https", "file"]


class SourcePolicySettings(Strict):
    """Which sources may be added (vdet.ingest.urls.SourcePolicy applies it): configured ones
    and those POSTed alike. The package's bundled demo clip is always allowed."""

    schemes: list[SourceScheme] = Field(
        default_factory=lambda: list(get_args(SourceScheme)),
        min_length=1,
        max_length=5,
        description="URL schemes a source may use ('file' also covers plain paths).",
    )
    hosts: list[Annotated[str, Field(min_length=1, max_length=253)]] | None = Field(
        default=None,
        max_length=1024,
        description="Hosts network sources may name: host names ('cam.local', "
        "'*.cams.example' for any subdomain) or IP addresses and networks ('10.0.0.0/8'). "
        "Names are matched as written, never resolved. null: any host.",
        examples=[["10.0.0.0/8", "cam.local"]],
    )
    file_roots: list[Path] = Field(
        default_factory=list,
        max_length=64,
        description="Folders whose files may be sources (symbolic links resolved). Empty: "
        "only the bundled demo clip.",
    )
    max_redirects: int = Field(
        default=3,
        ge=0,
        le=10,
        description="Redirects (HTTP or RTSP 3xx) a network source may send vdet through on "
        "one connect; each target must pass this policy (scheme, host) before it is "
        "contacted, stay within HTTP(S) or RTSP(S) and never leave TLS. 0: none followed. "
        "With `hosts` set, RTSP sources are relayed on the loopback so that no redirect "
        "bypasses the check (vdet.ingest.redirects).",
    )


class IngestSettings(Strict):
    """How source threads open, read, watch and reconnect to sources (vdet.ingest.source_thread
    runs each stream with them)."""

    connect_timeout_s: float = Field(
        default=5.0,
        ge=0.1,
        le=300.0,
        description="Longest connect, and longest stream probe, of one attempt (seconds).",
    )
    read_timeout_s: float = Field(
        default=5.0,
        ge=0.1,
        le=300.0,
        description="Longest wait for any data from a connected source (seconds).",
    )
    stall_timeout_s: float = Field(
        default=5.0,
        ge=0.1,
        le=600.0,
        description="A connected source with no decoded frame this long is stalled.",
    )
    backoff_initial_s: float = Field(
        default=0.5,
        ge=0.001,
        le=3600.0,
        description="Wait before the first reconnect after a failure (seconds).",
    )
    backoff_max_s: float = Field(
        default=30.0,
        ge=0.001,
        le=3600.0,
        description="Longest wait between reconnects, jitter included (seconds).",
    )
    backoff_multiplier: float = Field(
        default=2.0,
        ge=1.0,
        le=10.0,
        description="Each consecutive failure multiplies the wait by this.",
    )
    jitter: float = Field(
        default=0.2,
        ge=0.0,
        le=1.0,
        description="Random spread of each wait, a fraction: 0.2 is +-20 %.",
    )
    max_consecutive_decode_errors: int = Field(
        default=50,
        ge=1,
        le=1_000_000,
        description="Reconnect after this many packets in a row fail to decode.",
    )
    pass_damaged_frames: bool = Field(
        default=False,
        description="Detect on frames of a damaged reference chain (after a decode error, a "
        "corrupt packet or lost H.264 reference pictures, until the next keyframe) instead of "
        "dropping them. The decoder's concealment of lost data then reaches the detector, "
        "which takes some of it for objects.",
    )
    source_policy: SourcePolicySettings = Field(
        default_factory=SourcePolicySettings,
        description="Allowed schemes, hosts and file folders of sources.",
    )

    @model_validator(mode="after")
    def _backoff_order(self) -> IngestSettings:
        if self.backoff_initial_s > self.backoff_max_s:
            raise ValueError(
                f"backoff_initial_s ({self.backoff_initial_s}) must not exceed "
                f"backoff_max_s ({self.backoff_max_s})"
            )
        return self
