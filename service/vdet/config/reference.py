"""What the settings are, read from the models themselves: every key with its type, default,
bounds, description and environment variable (`keys`), the models below a key path
(`model_at`, for "did you mean"), and the configuration reference in Markdown (`markdown`,
kept in docs/configuration.md by a test)."""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import annotated_types
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

ENV_PREFIX = "VDET_"


@dataclass(frozen=True)
class KeyDoc:
    """One setting: its dotted path (`[]` for the items of a list), what it takes and means."""

    path: str
    type: str
    default: str
    bounds: str
    description: str
    env: str | None  # None: not settable alone from the environment (inside a list item)
    section: bool  # a group of keys (a model), documented by the keys below it


def model_of(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """The model an annotation holds (unwrapping Optional, Annotated, list), and whether it is
    the item of a list."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return model_of(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found, listed = model_of(arg)
            if found is not None:
                return found, listed
        return None, False
    if origin in (list, tuple, Sequence):
        args = typing.get_args(annotation)
        found, _ = model_of(args[0]) if args else (None, False)
        return found, found is not None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    return None, False


def model_at(root: type[BaseModel], loc: Sequence[str | int]) -> type[BaseModel] | None:
    """The model whose keys are valid at `loc` (a validation error's location, list indices
    included), or None when `loc` is not inside a model."""
    model: type[BaseModel] | None = root
    for part in loc:
        if isinstance(part, int) or model is None:
            continue  # a list index: the same item model
        field = model.model_fields.get(part)
        if field is None:
            return None
        model, _ = model_of(field.annotation)
    return model


def keys(root: type[BaseModel]) -> list[KeyDoc]:
    """Every key of `root` and of the models below it, in declaration order."""
    return list(_walk(root, "", ENV_PREFIX))


def _walk(model: type[BaseModel], prefix: str, env: str | None) -> Iterator[KeyDoc]:
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        var = f"{env}{name.upper()}" if env is not None else None
        sub, listed = model_of(field.annotation)
        yield KeyDoc(
            path=path,
            type=("list of " if listed else "") + ("section" if sub else _type(field.annotation)),
            default=_default(field) if not sub or listed else "",
            bounds=_bounds(field),
            description=" ".join((field.description or "").split()),
            env=var,
            section=sub is not None,
        )
        if sub is not None:
            yield from _walk(
                sub, f"{path}[]." if listed else f"{path}.", None if listed else f"{var}__"
            )


def _type(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type(args[0])
    if origin is typing.Literal:
        return " \\| ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type(a) for a in args)
    if origin in (list, tuple, set, frozenset, Sequence):
        return f"list of {_type(args[0])}" if args else "list"
    if origin is dict:
        return f"map {_type(args[0])} to {_type(args[1])}" if args else "map"
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type):
        if issubclass(annotation, Enum):
            return " \\| ".join(json.dumps(m.value) for m in annotation)
        if issubclass(annotation, Path):
            return "path"
        if issubclass(annotation, SecretStr):
            return "secret text"
        return {"str": "text", "int": "integer", "float": "number", "bool": "boolean"}.get(
            annotation.__name__, annotation.__name__
        )
    return str(annotation).replace("typing.", "")


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        try:
            value = field.default_factory()  # type: ignore[call-arg]
        except TypeError:
            return "(computed)"
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    if isinstance(value, SecretStr):
        return "(secret)"
    if isinstance(value, Path):
        return "(computed)" if value.is_absolute() else str(value)
    try:
        return json.dumps(value, default=str)
    except (TypeError, ValueError):
        return str(value)


def _bounds(field: FieldInfo) -> str:
    own = _describe_bounds(field.metadata)
    # Bounds of the items of a list or of the arms of Optional: Annotated[int, Field(ge=0)].
    inner: list[Any] = []
    for arg in typing.get_args(field.annotation):
        if typing.get_origin(arg) is typing.Annotated:
            for meta in typing.get_args(arg)[1:]:
                inner.extend(getattr(meta, "metadata", [meta]))
    listed = typing.get_origin(field.annotation) in (list, tuple, set, frozenset)
    items = _describe_bounds(inner)
    if items and listed:
        items = f"each {items}"
    return ", ".join(part for part in (own, items) if part)


def _describe_bounds(metadata: Sequence[Any]) -> str:
    parts: list[str] = []
    for item in metadata:
        for attr, word in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            value = getattr(item, attr, None)
            if value is not None and isinstance(item, annotated_types.BaseMetadata):
                parts.append(f"{word} {value}")
        if isinstance(item, annotated_types.MinLen):
            parts.append(f"at least {item.min_length} long")
        if isinstance(item, annotated_types.MaxLen):
            parts.append(f"at most {item.max_length} long")
        pattern = getattr(item, "pattern", None)
        if isinstance(pattern, str):
            parts.append(f"matches `{pattern}`")
    return ", ".join(dict.fromkeys(parts))


def markdown(root: type[BaseModel]) -> str:
    """The configuration reference: one table per section, every key of `root`."""
    docs = keys(root)
    sections: dict[str, list[KeyDoc]] = {"": []}
    for doc in docs:
        parent = doc.path.rsplit(".", 1)[0] if "." in doc.path else ""
        sections.setdefault(parent, []).append(doc)
        if doc.section:
            sections.setdefault(doc.path + ("[]" if doc.type.startswith("list") else ""), [])
    lines: list[str] = []
    described = {d.path + ("[]" if d.type.startswith("list") else ""): d for d in docs if d.section}
    for name, rows in sections.items():
        if not rows:
            continue
        head = described.get(name)
        lines.append(f"### `{name}`" if name else "### Top level")
        lines.append("")
        if head is not None and head.description:
            lines += [head.description, ""]
        if head is not None and head.env is not None:
            lines += [
                f"Environment: `{head.env}__<KEY>`, or the whole section as JSON in `{head.env}`.",
                "",
            ]
        lines.append("| key | type | default | bounds | environment | description |")
        lines.append("|---|---|---|---|---|---|")
        for row in rows:
            key = row.path.rsplit(".", 1)[-1]
            kind = f"{row.type} (below)" if row.section else row.type
            env = f"`{row.env}`" if row.env else "—"
            default = f"`{_cell(row.default)}`" if row.default else ""
            lines.append(
                f"| `{key}` | {kind} | {default} | {_cell(row.bounds)} | {env} | "
                f"{_cell(row.description)} |"
            )
        lines.append("")
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
