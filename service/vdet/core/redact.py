"""Credentials out of text: every URL's user and password, and the values of its secret query
parameters, replaced before the text is shown.

Camera URLs carry credentials: `rtsp://user:pass@cam/...`, and just as often
`http://cam/video.cgi?user=admin&password=...` or a signed `...?token=...`. Whatever shows a URL
or an error that may quote one (API answers, logs, metrics, config errors) passes it through
`redact`.

Which query parameters are secret is a process-wide setting (`secret_query_params`, set by
`use_secret_params` where a process starts): a parameter is secret when its name, or one of
the words of its name (split at '_', '-' and '.'), is one of them, ignoring case:
`access_token`, `X-Amz-Signature` and `api.key` all are with the defaults.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import unquote

DEFAULT_SECRET_PARAMS = (
    "password",
    "passwd",
    "pass",
    "pwd",
    "passphrase",
    "token",
    "key",
    "apikey",
    "secret",
    "auth",
    "authorization",
    "signature",
    "sig",
    "credential",
    "credentials",
    "session",
    "sessionid",
    "sid",
    "otp",
)

# Up to the last '@' of the authority: a password may contain an unescaped '@'.
_USERINFO_RE = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/?#\s]*@")
# A query parameter: after '?', '&' or ';', a name, '=', a value up to the next separator.
_PARAM_RE = re.compile(r"([?&;])([^=&;#?\s'\"<>]{1,256})=([^&;#\s'\"<>]*)")
_WORD_RE = re.compile(r"[_\-.]+")

_secret_words: frozenset[str] = frozenset(DEFAULT_SECRET_PARAMS)


def use_secret_params(names: Iterable[str]) -> None:
    """Make `names` the secret query parameters of this process (see the module docstring)."""
    global _secret_words
    _secret_words = frozenset(name.lower() for name in names)


def is_secret_param(name: str) -> bool:
    """Whether a query parameter called `name` (percent-encoded or not) carries a secret."""
    name = unquote(name).lower()
    return name in _secret_words or any(w in _secret_words for w in _WORD_RE.split(name))


def redact(text: str) -> str:
    """`text` with the credentials of every URL in it replaced: ``rtsp://***@cam/...``, and
    ``...?user=admin&password=***``."""
    text = _USERINFO_RE.sub(lambda m: f"{m.group(1)}***@", text)
    if "=" not in text:
        return text
    return _PARAM_RE.sub(_param, text)


def _param(match: re.Match[str]) -> str:
    if not match.group(3) or not is_secret_param(match.group(2)):
        return match.group(0)
    return f"{match.group(1)}{match.group(2)}=***"
