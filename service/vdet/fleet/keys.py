"""Which stream ids a fleet can hold: each is a key in the fleet's buckets and a token of a
NATS subject, which a single-node id may not be (a leading, trailing or doubled '.')."""

from __future__ import annotations

import re

from vdet.config.streams import STREAM_ID_PATTERN

_STREAM_ID = re.compile(STREAM_ID_PATTERN)


def key_problem(stream_id: str) -> str | None:
    """Why `stream_id` cannot be a stream of a fleet, or None when it can."""
    if not _STREAM_ID.match(stream_id):
        return f"stream id {stream_id!r} is not 1-64 letters, digits, '_', '.', '-'"
    if stream_id.startswith(".") or stream_id.endswith(".") or ".." in stream_id:
        return (
            f"stream id {stream_id!r}: in a fleet an id cannot start or end with '.' or hold "
            "'..' (it names a NATS subject)"
        )
    return None


__all__ = ["key_problem"]
