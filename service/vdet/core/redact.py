"""Credentials out of text: every URL's user and password replaced before the text is shown.

Camera URLs carry credentials (`rtsp://user:pass@cam/...`). Whatever shows a URL or an error
that may quote one (API answers, logs, metrics, config errors) passes it through `redact`.
"""

from __future__ import annotations

import re

# Up to the last '@' of the authority: a password may contain an unescaped '@'.
_USERINFO_RE = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/?#\s]*@")


def redact(text: str) -> str:
    """`text` with the credentials of every URL in it replaced: ``rtsp://***@cam/...``."""
    return _USERINFO_RE.sub(lambda m: f"{m.group(1)}***@", text)
