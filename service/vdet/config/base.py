"""The one strict base of every settings model, and the error a bad configuration raises."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

MiB = 1 << 20


class ConfigError(ValueError):
    """The configuration is invalid; the message lists every offending key and why."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")
