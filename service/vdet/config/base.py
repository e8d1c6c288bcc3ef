"""The one strict base of every settings model and request body, and the error a bad
configuration raises."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

MiB = 1 << 20


# Strict: a JSON `false` or `1.0` is neither a name nor an id (lax parsing made false class 0).
ClassRef = Annotated[
    Annotated[str, Field(strict=True, min_length=1, max_length=256)]
    | Annotated[int, Field(strict=True)],
    Field(description="A class name from the model, or its integer id."),
]


class ConfigError(ValueError):
    """The configuration is invalid; the message lists every offending key and why."""


class Strict(BaseModel):
    """Unknown keys refused, no infinite or NaN float, and no text that is not Unicode.

    JSON can spell a string that no UTF-8 encoder accepts ("\\ud800", a lone surrogate): such
    text would fail later, when a response, a log line or the streams file is written, so it
    is refused here, at the edge.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _unicode_text(cls, value: Any) -> Any:
        _check_text(value)
        return value


def _check_text(value: Any) -> None:
    if isinstance(value, str):
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as e:
                raise ValueError(
                    f"text at character {e.start} is not Unicode (a lone surrogate)"
                ) from None
    elif isinstance(value, list | tuple | set | frozenset):
        for item in value:
            _check_text(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_text(key)
            _check_text(item)
