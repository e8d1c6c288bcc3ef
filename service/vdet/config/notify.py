"""Zone and line events out: webhooks, MQTT and the filters they share (`notify`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from vdet.config.base import Strict
from vdet.config.streams import STREAM_ID_PATTERN
from vdet.core.types import ZoneEventType


class EventFilterSettings(Strict):
    """Which zone and line events a sink gets; every filter given must hold (null: any)."""

    events: list[ZoneEventType] | None = Field(
        default=None, min_length=1, description="Only these event types; null: all."
    )
    streams: list[Annotated[str, Field(pattern=STREAM_ID_PATTERN)]] | None = Field(
        default=None, min_length=1, max_length=1024, description="Only these streams; null: all."
    )
    zones: list[Annotated[str, Field(min_length=1, max_length=64)]] | None = Field(
        default=None,
        min_length=1,
        max_length=1024,
        description="Only events of zones or lines with these ids; null: all.",
    )
    classes: list[Annotated[str, Field(min_length=1, max_length=256)]] | None = Field(
        default=None,
        min_length=1,
        max_length=1000,
        description="Only events of tracks of these classes (names, checked against the model "
        "at start); null: all.",
    )


class WebhookSettings(EventFilterSettings):
    """One HTTP endpoint that gets the zone and line events of the streams, as they happen
    (docs/notify.md: body, signature, retries)."""

    id: str = Field(
        pattern=STREAM_ID_PATTERN,
        description="The webhook's name in metrics and logs: 1-64 letters, digits, '_', '.', '-'.",
    )
    url: str = Field(
        min_length=1,
        max_length=4096,
        pattern=r"^https?://[^\s]+$",
        description="Where events are POSTed (http:// or https://); never followed elsewhere "
        "(redirects are a failed delivery).",
        examples=["https://hooks.example.com/vdet"],
    )
    tls_ca_file: Path | None = Field(
        default=None,
        description="https:// only: PEM file of the CA(s) that signed the endpoint's "
        "certificate (a site's own CA), checked instead of the system's CAs; the endpoint's "
        "name is checked either way.",
    )
    secret: SecretStr | None = Field(
        default=None,
        description="Signs each body: header X-Vdet-Signature: t=<unix time>,v1=<hex of "
        "HMAC-SHA256(secret, '<t>.<body>')>, so the receiver can check who sent it and when.",
    )
    headers: dict[Annotated[str, Field(pattern=r"^[A-Za-z0-9-]{1,64}$")], SecretStr] = Field(
        default_factory=dict,
        max_length=16,
        description="Extra request headers (an Authorization header, say); values are secrets: "
        "never logged.",
    )
    timeout_s: float = Field(
        default=5.0, gt=0.0, le=60.0, description="Longest one delivery attempt may take."
    )
    max_attempts: int = Field(
        default=5,
        ge=1,
        le=20,
        description="Attempts per delivery (connection errors, timeouts, 429 and 5xx are "
        "retried after 0.5, 1, 2, ... s, at most 30 s apart); then it counts as failed.",
    )
    max_pending: int = Field(
        default=1000,
        ge=1,
        le=100_000,
        description="Deliveries waiting while the endpoint is slow or down; beyond this the "
        "oldest waiting one is dropped (counted), so memory stays bounded.",
    )

    @model_validator(mode="after")
    def _ca_file_needs_https(self) -> WebhookSettings:
        if self.tls_ca_file is not None and not self.url.lower().startswith("https://"):
            raise ValueError("tls_ca_file is for an https:// url")
        return self

    @field_validator("headers")
    @classmethod
    def _headers_vdet_sets_itself(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        reserved = {"content-type", "content-length", "host", "x-vdet-signature"}
        if taken := sorted(name for name in value if name.lower() in reserved):
            raise ValueError(f"headers {taken} are set by vdet itself")
        return value


class MqttSettings(EventFilterSettings):
    """An MQTT broker that gets the zone and line events, and vdet's availability
    (docs/notify.md, "MQTT": topics and payloads)."""

    host: str = Field(
        min_length=1, max_length=253, pattern=r"^[A-Za-z0-9.:_-]+$", description="Broker host."
    )
    port: int = Field(default=1883, ge=1, le=65535, description="Broker port (TLS: often 8883).")
    tls: bool = Field(
        default=False,
        description="TLS to the broker, its certificate and name checked against the system's "
        "CAs or `tls_ca_file`.",
    )
    tls_ca_file: Path | None = Field(
        default=None,
        description="PEM file of the CA(s) that signed the broker's certificate (a site's own "
        "CA); implies tls.",
    )
    username: str | None = Field(
        default=None, min_length=1, max_length=256, description="Broker login, with password."
    )
    password: SecretStr | None = Field(default=None, description="Never logged.")
    client_id: str = Field(
        default="vdet",
        pattern=r"^[A-Za-z0-9_.-]{1,64}$",
        description="The MQTT client id; unique per vdet on one broker (a second connection "
        "with the same id makes the broker drop the first).",
    )
    topic_prefix: str = Field(
        default="vdet",
        pattern=r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$",
        max_length=128,
        description="Topics start with this: <prefix>/status (online/offline, retained) and "
        "<prefix>/streams/<stream id>/events; no wildcards, no leading or trailing '/'.",
    )
    qos: Literal[0, 1, 2] = Field(
        default=1, description="QoS of event messages (1: at least once, while connected)."
    )
    keepalive_s: int = Field(default=30, ge=5, le=3600, description="MQTT keepalive.")
    max_queued: int = Field(
        default=10_000,
        ge=1,
        le=1_000_000,
        description="Event messages held while the broker is away or slow; beyond this a new "
        "one is dropped (counted).",
    )
    snapshots: bool = Field(
        default=False,
        description="Also publish the event snapshot (JPEG) of each frame whose events the "
        "filters keep to <prefix>/streams/<id>/snapshot, retained: the stream's latest event "
        "picture (a Home Assistant MQTT camera shows it). Needs event_snapshots.per_stream > 0.",
    )
    home_assistant: bool = Field(
        default=False,
        description="With snapshots: announce each stream's snapshot topic to Home Assistant "
        "(MQTT discovery, retained, before its first snapshot), so it appears as a camera "
        "without configuring it there.",
    )
    discovery_prefix: str = Field(
        default="homeassistant",
        pattern=r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$",
        max_length=128,
        description="Home Assistant's MQTT discovery prefix.",
    )

    @model_validator(mode="after")
    def _home_assistant_needs_snapshots(self) -> MqttSettings:
        if self.home_assistant and not self.snapshots:
            raise ValueError("home_assistant announces the snapshot cameras: set snapshots too")
        return self


class NotifySettings(Strict):
    """Where zone and line events go besides the WebSocket feeds."""

    webhooks: list[WebhookSettings] = Field(
        default_factory=list, max_length=16, description="HTTP endpoints for the events."
    )
    mqtt: MqttSettings | None = Field(
        default=None, description="An MQTT broker for the events; null: none."
    )
    shutdown_grace_s: float = Field(
        default=2.0,
        ge=0.0,
        le=60.0,
        description="At shutdown, how long deliveries still waiting may take to go out before "
        "they are dropped (counted).",
    )
    public_url: str | None = Field(
        default=None,
        max_length=2048,
        pattern=r"^https?://[^\s?#]+$",
        description="The address receivers reach vdet at (behind a proxy, say): bodies then "
        "name their frame's event snapshot by a whole URL under it, not a path.",
        examples=["https://vdet.site-7.example"],
    )

    @field_validator("public_url")
    @classmethod
    def _no_trailing_slash(cls, value: str | None) -> str | None:
        return None if value is None else value.rstrip("/")

    @model_validator(mode="after")
    def _unique_ids(self) -> NotifySettings:
        ids = [hook.id for hook in self.webhooks]
        if len(ids) != len(set(ids)):
            raise ValueError(f"webhook ids must be unique, got {ids}")
        return self
