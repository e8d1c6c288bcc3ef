"""Redirects of network sources, held to the source policy hop by hop.

FFmpeg follows an HTTP 3xx (up to 8 by default) and an RTSP 3xx (any number, on every connect,
no option turns it off) to wherever `Location:` points, so a source at an allowed host could
send vdet to any other. With a source policy, vdet therefore never lets FFmpeg follow one:

- HTTP(S): FFmpeg gets `max_redirects=0` and fails on a 3xx; the reader then asks the same
  (allowed) URL itself (`http_location`: one GET, its head read, the connection closed) for
  the `Location`.
- RTSP(S): FFmpeg talks to the camera through an `RtspRelay` (vdet.ingest.rtsp_relay), a
  relay on the loopback that passes every byte but a 3xx answer: that one it keeps (its
  `Location`), answers FFmpeg 502 in its place and closes both connections.

The reader checks the `Location` (`check_redirect`: the same scheme family, no downgrade
from TLS, the policy's schemes and hosts) and only then connects to it, up to
`max_redirects` hops. A refused target is never contacted. Without host restrictions in the
policy RTSP goes to the camera directly (no relay; FFmpeg's protocol whitelist still keeps
its redirects within RTSP over TCP), because then every host is allowed anyway.
"""

from __future__ import annotations

import logging
from urllib.parse import urljoin, urlsplit

import httpx

from vdet.core.redact import redact
from vdet.ingest.urls import SourcePolicy, validate_source_url

log = logging.getLogger(__name__)

_FAMILIES = {"http": "http", "https": "http", "rtsp": "rtsp", "rtsps": "rtsp"}


class RedirectError(Exception):
    """A source answered with a redirect vdet does not follow; the message says where and why
    (the target redacted)."""


def check_redirect(source: str, location: str, policy: SourcePolicy) -> str:
    """`location` (absolute, or relative to `source`) as the next URL to open, if `policy`
    allows it; else RedirectError. A redirect stays in its scheme family (http/https,
    rtsp/rtsps) and never leaves TLS."""
    target = urljoin(source, location.strip())
    old = urlsplit(source).scheme.lower()
    new = urlsplit(target).scheme.lower()
    shown = redact(target)
    if _FAMILIES.get(new) != _FAMILIES[old]:
        raise RedirectError(f"redirect to {shown!r} refused: not a {old} URL")
    if old.endswith("s") and not new.endswith("s"):
        raise RedirectError(f"redirect to {shown!r} refused: it leaves TLS")
    try:
        return validate_source_url(target, policy)
    except ValueError as exc:
        raise RedirectError(f"redirect to {shown!r} refused: {exc}") from None


def http_location(url: str, timeout_s: float) -> str | None:
    """The `Location` an HTTP(S) URL redirects to, None when it does not redirect (or cannot
    be asked). Reads the answer's head only. Like FFmpeg's own HTTPS, certificates are not
    verified."""
    try:
        with (
            httpx.Client(follow_redirects=False, timeout=timeout_s, verify=False) as client,
            client.stream("GET", url) as answer,
        ):
            if answer.is_redirect:
                location: str | None = answer.headers.get("location")
                return location
    except (httpx.HTTPError, ValueError) as exc:
        log.debug("asking %s for its redirect: %s", redact(url), exc)
    return None
