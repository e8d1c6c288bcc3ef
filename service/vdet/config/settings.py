"""Service configuration: one validated `Settings`, from defaults, a YAML file and `VDET_*` env.

Precedence, highest first: keyword arguments, environment (`VDET_PORT=9000`, nested with `__`:
`VDET_DETECTION__CONF_THRESHOLD=0.4`), the YAML file (`--config` or `VDET_CONFIG`), defaults.
Unknown keys are rejected, in the file and in nested env groups, so a typo fails at startup
instead of being ignored. This module only describes and validates; it starts nothing.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from vdet.config.base import ConfigError, MiB
from vdet.config.clips import ClipSettings
from vdet.config.cluster import ClusterSettings
from vdet.config.engine import EngineSettings
from vdet.config.event_snapshots import EventSnapshotSettings
from vdet.config.gpu import GpuSettings
from vdet.config.hub import HubSettings
from vdet.config.ingest import IngestSettings
from vdet.config.limits import LimitSettings
from vdet.config.live import LiveSettings
from vdet.config.notify import NotifySettings
from vdet.config.reference import model_at
from vdet.config.streams import STREAM_ID_PATTERN, DetectionDefaults, StreamSpec
from vdet.config.workers import WorkerSettings
from vdet.core.assets import default_model_path
from vdet.core.redact import DEFAULT_SECRET_PARAMS, redact

CONFIG_ENV_VAR = "VDET_CONFIG"


# The YAML file for the Settings being built now; set by load_settings, else $VDET_CONFIG.
_config_file: ContextVar[Path | None] = ContextVar("vdet_config_file", default=None)


class Settings(BaseSettings):
    """Everything `vdet serve` needs. See the module docstring for where values come from."""

    model_config = SettingsConfigDict(
        env_prefix="VDET_",
        env_nested_delimiter="__",
        extra="forbid",
        validate_default=True,
    )

    host: str = Field(default="127.0.0.1", min_length=1, description="Address to listen on.")
    port: int = Field(default=8000, ge=1, le=65535, description="TCP port to listen on.")
    api_key: SecretStr | None = Field(
        default=None,
        description="When set, every endpoint except /healthz, /readyz, /metrics and the web "
        "page's files (/, /ui/) requires it (X-API-Key or Authorization: Bearer; WebSockets: "
        "?api_key= or subprotocol).",
    )
    secret_query_params: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(
        default=list(DEFAULT_SECRET_PARAMS),
        max_length=256,
        description="Query-string parameters of source and webhook URLs whose values are "
        "secrets: shown as *** wherever a URL is (API answers, logs, errors), like a URL's "
        "user:password@. A parameter is secret when its name, or a word of its name (split at "
        "'_', '-', '.'), is listed, ignoring case: access_token and X-Amz-Signature are, "
        "with the defaults.",
    )
    max_streams: int = Field(default=16, ge=1, le=1024, description="Most concurrent streams.")
    max_upload_bytes: int = Field(
        default=20 * MiB,
        ge=1024,
        le=1 << 30,
        description="Largest request body accepted by POST /v1/detect.",
    )
    allow_file_sources: bool = Field(
        default=True,
        description="Whether POST /v1/streams may name local files at all (those within "
        "ingest.source_policy.file_roots, or the bundled demo clip); their frames are shown "
        "in snapshots. Sources in this file are not affected by it (the policy still is).",
    )
    limits: LimitSettings = Field(
        default_factory=LimitSettings,
        description="Request body sizes, read timeouts and the /v1/detect concurrency cap.",
    )
    model_path: Path = Field(
        default_factory=default_model_path,
        description="Detection model (ONNX, raw YOLOv8 head). Default: the bundled demo model.",
    )
    backend: str = Field(
        default="auto",
        min_length=1,
        max_length=64,
        description="Inference backend kind; 'auto' picks the best one available.",
    )
    input_shape: Literal["rect", "square"] = Field(
        default="rect",
        description="rect: each frame is letterboxed into the smallest input (sides multiples of "
        "the model's stride) that holds it, 640x384 for 16:9 at 640: about 40% less network work "
        "for the same boxes, where the backend takes such inputs (a model whose height and "
        "width are dynamic, on ONNX Runtime or torch; a TensorRT engine whose profile covers "
        "them); square: always the model's input size. On the GPU path a stream's CUDA graph "
        "is captured for its shape and batches hold one shape each (docs/gpu-data-path.md).",
    )
    cpu_sessions: int | None = Field(
        default=None,
        ge=1,
        le=16,
        description="ONNX Runtime on the CPU: sessions of the model, each with its share of "
        "the cores; each stream keeps this many frames in detection at once (more frames per "
        "second, more latency per frame). null: 2 where there are 2 cores or more, else 1. "
        "Streams in the API process only; stream worker processes (`workers`) keep one "
        "session with their share of the cores.",
    )
    detection: DetectionDefaults = Field(
        default_factory=DetectionDefaults, description="Postprocessing defaults."
    )
    ingest: IngestSettings = Field(
        default_factory=IngestSettings, description="Source reading and reconnects."
    )
    hub: HubSettings = Field(default_factory=HubSettings, description="Result replay buffers.")
    event_snapshots: EventSnapshotSettings = Field(
        default_factory=EventSnapshotSettings,
        description="JPEGs of the frames with zone and line events, per stream.",
    )
    clips: ClipSettings = Field(
        default_factory=ClipSettings,
        description="Event clips: the camera's own video around zone and line events, kept "
        "in a folder (off until `folder` is set).",
    )
    engine: EngineSettings = Field(
        default_factory=EngineSettings,
        description="TensorRT engines (the tensorrt backend and `vdet engine build`).",
    )
    gpu: GpuSettings = Field(
        default_factory=GpuSettings,
        description="NVDEC decode, per-GPU devices, CUDA graphs and batching (GPU backends).",
    )
    workers: WorkerSettings = Field(
        default_factory=WorkerSettings,
        description="Stream worker processes behind the one API (see docs/workers.md).",
    )
    live: LiveSettings = Field(
        default_factory=LiveSettings, description="Live video for the web page and viewers."
    )
    sources: list[StreamSpec] = Field(
        default_factory=list,
        max_length=1024,
        description="Streams added at start-up.",
    )
    notify: NotifySettings = Field(
        default_factory=NotifySettings,
        description="Webhooks for zone and line events (docs/notify.md).",
    )
    streams_file: Path | None = Field(
        default=None,
        description="A JSON file where the streams are kept as the API leaves them (added, "
        "changed, zones, removed) and started again at the next start; written in one step "
        "after each change, readable by its owner only (source URLs carry credentials). A "
        "configured source keeps its API changes until its entry in the config file is "
        "edited. null: what the API changes lasts until the service stops.",
        examples=["/var/lib/vdet/streams.json"],
    )
    cluster: ClusterSettings = Field(
        default_factory=ClusterSettings,
        description="A fleet of nodes on NATS JetStream (docs/fleet.md); without servers, one "
        "node.",
    )
    log_level: Literal["debug", "info", "warning", "error", "critical"] = Field(
        default="info", description="Log level for vdet and uvicorn."
    )

    @field_validator("api_key")
    @classmethod
    def _api_key_long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < 8:
            raise ValueError("api_key must be at least 8 characters")
        return value

    @model_validator(mode="after")
    def _fleet_keeps_the_streams(self) -> Settings:
        if self.cluster.enabled and self.streams_file is not None:
            raise ValueError(
                "streams_file and cluster.servers exclude each other: in a fleet the streams "
                "are kept in the fleet's bucket on the NATS servers"
            )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        config_file = _config_file.get() or os.environ.get(CONFIG_ENV_VAR)
        if not config_file:
            return init_settings, env_settings
        return (
            init_settings,
            env_settings,
            YamlConfigSettingsSource(settings_cls, yaml_file=config_file),
        )


def load_settings(config_file: str | os.PathLike[str] | None = None, **overrides: Any) -> Settings:
    """Build Settings from `config_file` (else $VDET_CONFIG), the environment and `overrides`.

    Raises ConfigError with one line per problem (key path and reason, plus the file name) for
    a missing or unreadable file, unknown keys and out-of-range values.
    """
    _check_env_names(os.environ)
    path = Path(config_file) if config_file is not None else None
    if path is None and os.environ.get(CONFIG_ENV_VAR):
        path = Path(os.environ[CONFIG_ENV_VAR])
    if path is not None and not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    token = _config_file.set(path)
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, path)) from None
    except (ValueError, TypeError, OSError, yaml.YAMLError) as exc:
        # YAML syntax errors, a file whose top level is not a mapping, an unreadable file.
        raise ConfigError(f"cannot read config file {path}: {exc}") from None
    finally:
        _config_file.reset(token)


# VDET_* variables that vdet reads itself, outside Settings: accepted next to the settings.
OTHER_ENV_VARS: frozenset[str] = frozenset(
    {
        CONFIG_ENV_VAR,
    }
)


def _check_env_names(environ: Mapping[str, str]) -> None:
    """Reject VDET_* variables that name no setting: a typo must not be silently ignored."""
    known = {name.upper() for name in Settings.model_fields} | {v[5:] for v in OTHER_ENV_VARS}
    unknown = sorted(
        name
        for name in environ
        if name.upper().startswith("VDET_") and name[5:].upper().split("__")[0] not in known
    )
    if unknown:
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(
                name[5:].upper().split("__")[0], sorted(known), n=1, cutoff=0.6
            )
            if close:
                hints.append(f"{name}: did you mean VDET_{close[0]}?")
        raise ConfigError(
            f"unknown environment variable(s) {', '.join(unknown)}"
            + (f" ({'; '.join(hints)})" if hints else "")
            + f"; settings are {', '.join(sorted('VDET_' + k for k in known))} "
            "(nested keys with '__')"
        )


def _describe(exc: ValidationError, path: Path | None) -> str:
    where = f" (config file {path}; environment VDET_*)" if path else " (environment VDET_*)"
    lines = [f"invalid configuration{where}:"]
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "<root>"
        if err["type"] == "extra_forbidden":
            lines.append(f"  {key}: unknown key{_did_you_mean(err['loc'])}")
        elif "api_key" in key:  # never echo a secret
            lines.append(f"  {key}: {err['msg']}")
        else:
            message = _PATTERN_WORDS.get(str((err.get("ctx") or {}).get("pattern")), err["msg"])
            lines.append(f"  {key}: {message} (got {redact(repr(err.get('input')))})")
    lines.append(
        "  (every key, its type and bounds: docs/configuration.md, or vdet config reference)"
    )
    return "\n".join(lines)


# What the settings' patterns mean, for errors a person reads instead of a regular expression.
_PATTERN_WORDS = {
    r"^https?://[^\s]+$": "must be an http:// or https:// URL without spaces",
    r"^https?://[^\s?#]+$": "must be an http:// or https:// URL without spaces, query or fragment",
    STREAM_ID_PATTERN: "must be 1-64 letters, digits, '_', '.' or '-'",
    r"^[A-Za-z0-9-]{1,64}$": "must be a header name: 1-64 letters, digits or '-'",
    r"^[A-Za-z0-9.:_-]+$": "must be a host name or IP address",
    r"^[A-Za-z0-9_.-]{1,64}$": "must be 1-64 letters, digits, '_', '.' or '-'",
    r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$": "must be words of letters, digits, '_', '.' or "
    "'-' separated by single '/' (no wildcards, no leading or trailing '/')",
}


def _did_you_mean(loc: tuple[str | int, ...]) -> str:
    """'; did you mean X?' for an unknown key near a known one, else the keys known there."""
    name = loc[-1] if loc else ""
    model = model_at(Settings, loc[:-1])
    if model is None or not isinstance(name, str):
        return ""
    known = list(model.model_fields)
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {close[0]!r}?"
    return f"; known keys here: {', '.join(known)}"
