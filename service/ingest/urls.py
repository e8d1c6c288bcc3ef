"""Validation of source URLs before anything tries to open them.

Owns the rule for which inputs a source may name: network cameras and streams (rtsp, rtsps,
http, https) and local files (file:// URLs or plain paths that exist). It must not open or
probe the source itself; that is the reader's job and may block.

FFmpeg interprets any ``name:`` prefix as a protocol (``concat:``, ``pipe:``, ``subfile:``,
``data:`` ...), some of which read arbitrary local files or file descriptors. A local file is
therefore always handed on as an absolute path, which FFmpeg can only take as a file.
"""

from __future__ import annotations

import os
import re
from urllib.parse import unquote, urlsplit

NETWORK_SCHEMES = ("rtsp", "rtsps", "http", "https")
FILE_SCHEME = "file"
ALLOWED_SCHEMES = (*NETWORK_SCHEMES, FILE_SCHEME)

# RFC 3986 scheme syntax; FFmpeg's protocol names are a subset of it.
_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*):")
_ALLOWED_TEXT = "rtsp://, rtsps://, http://, https://, file:// or a path to an existing file"


def validate_source_url(url: str) -> str:
    """Check `url` and return the string the reader should open.

    Network URLs come back unchanged apart from surrounding whitespace; ``file://`` URLs and
    plain paths come back as absolute local paths. Raises `ValueError` naming the allowed
    schemes for anything else, and for a local file that does not exist.
    """
    text = url.strip()
    if not text:
        raise ValueError(f"source URL is empty; expected {_ALLOWED_TEXT}")
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in text):
        raise ValueError("source URL contains control characters")

    match = _SCHEME_RE.match(text)
    if match is None:
        return _existing_file(text, text)
    scheme = match.group(1).lower()
    if scheme not in ALLOWED_SCHEMES:
        raise ValueError(f"unsupported source scheme {scheme!r}; expected {_ALLOWED_TEXT}")
    parts = urlsplit(text)
    if scheme == FILE_SCHEME:
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"file:// URL must name a local file, got host {parts.netloc!r}")
        return _existing_file(unquote(parts.path), text)

    if not text[len(scheme) + 1 :].startswith("//"):
        raise ValueError(f"{scheme} URL must look like {scheme}://host[:port]/path, got {url!r}")
    if not parts.hostname:
        raise ValueError(f"{scheme} URL has no host: {url!r}")
    try:
        _ = parts.port  # raises ValueError for a port that is not a number in 0..65535
    except ValueError as exc:
        raise ValueError(f"{scheme} URL has an invalid port: {url!r}") from exc
    return text


def is_network_url(url: str) -> bool:
    """True for URLs that name a live network source (EOF there is a failure, not the end)."""
    match = _SCHEME_RE.match(url.strip())
    return match is not None and match.group(1).lower() in NETWORK_SCHEMES


def _existing_file(path: str, original: str) -> str:
    if not path:
        raise ValueError(f"source URL names no file: {original!r}")
    absolute = os.path.abspath(os.path.expanduser(path))
    if not os.path.exists(absolute):
        raise ValueError(f"source file does not exist: {absolute}")
    if not os.path.isfile(absolute):
        raise ValueError(f"source path is not a regular file: {absolute}")
    return absolute
