"""Validation of source URLs before anything tries to open them.

Owns the rule for which inputs a source may name: network cameras and streams (rtsp, rtsps,
http, https) and local files (file:// URLs or plain paths that exist). It must not open or
probe the source itself; that is the reader's job and may block.

FFmpeg interprets any ``name:`` prefix as a protocol (``concat:``, ``pipe:``, ``subfile:``,
``data:`` ...), some of which read arbitrary local files or file descriptors. A local file is
therefore always handed on as an absolute path, which FFmpeg can only take as a file.

`SourcePolicy` is the operator's allow-list on top of that: schemes, hosts (names or IP
networks) and the folders local files may come from. The package's bundled assets (the demo
clip) are always allowed. Every file path that is refused or cannot be opened gets the same
message, so the errors say nothing about which paths exist. `ffmpeg_whitelists` names the
demuxers and protocols FFmpeg may use for a URL, so that a text file, a playlist or a nested
protocol can never become a source. Credentials in URLs are hidden by vdet.core.redact.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

from vdet.config.ingest import SourcePolicySettings
from vdet.core.assets import assets_dir
from vdet.core.redact import redact

NETWORK_SCHEMES = ("rtsp", "rtsps", "http", "https")
FILE_SCHEME = "file"
ALLOWED_SCHEMES = (*NETWORK_SCHEMES, FILE_SCHEME)

# RFC 3986 scheme syntax; FFmpeg's protocol names are a subset of it.
_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*):")
_ALLOWED_TEXT = "rtsp://, rtsps://, http://, https://, file:// or a path to an existing file"


# Demuxers a video source may be read by: containers and elementary streams of cameras,
# files and HTTP streams. Not: text and subtitle demuxers (they render a file's text as
# video), playlists and concatenation (hls, dash, concat: they open further URLs), image
# sequences, sdp (arbitrary RTP endpoints), lavfi.
VIDEO_DEMUXERS = (
    "mov,mp4,m4a,3gp,3g2,mj2",
    "matroska,webm",
    "mpegts",
    "avi",
    "flv",
    "h264",
    "hevc",
    "mjpeg",
    "mpjpeg",
    "rtsp",
)
_PROTOCOLS = {
    "rtsp": "rtsp,tcp,udp",
    "rtsps": "rtsps,tls,tcp",
    "http": "http,tcp",
    "https": "https,tls,tcp",
    "file": "file",
}
REFUSED_FILE = "source file is not allowed or cannot be opened"


@dataclass(frozen=True)
class SourcePolicy:
    """Which sources an operator allows. The default: any of the supported schemes, any
    host, and local files only from the bundled assets.

    `hosts` entries are host names (``cam.local``, ``*.cams.example``: any subdomain) or IP
    addresses and networks (``10.0.0.7``, ``10.0.0.0/8``, ``fd00::/8``); None allows every
    host. A host name is matched by name, never resolved, so a network entry only covers URLs
    that name an IP address. `file_roots` are folders (symbolic links resolved) whose files
    may be sources, besides the bundled assets. A network source's redirects are followed
    up to `max_redirects` hops, each target held to the same policy before it is contacted
    (vdet.ingest.redirects).
    """

    schemes: tuple[str, ...] = ALLOWED_SCHEMES
    hosts: tuple[str, ...] | None = None
    file_roots: tuple[Path, ...] = ()
    max_redirects: int = 3
    _networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = field(
        default=(), init=False, repr=False, compare=False
    )
    _names: tuple[str, ...] = field(default=(), init=False, repr=False, compare=False)

    @classmethod
    def of(cls, settings: SourcePolicySettings) -> SourcePolicy:
        """The policy the `ingest.source_policy` settings describe."""
        return cls(
            schemes=tuple(dict.fromkeys(settings.schemes)),
            hosts=tuple(settings.hosts) if settings.hosts is not None else None,
            file_roots=tuple(settings.file_roots),
            max_redirects=settings.max_redirects,
        )

    def __post_init__(self) -> None:
        unknown = [s for s in self.schemes if s not in ALLOWED_SCHEMES]
        if unknown:
            raise ValueError(f"unknown scheme(s) {unknown}; supported: {list(ALLOWED_SCHEMES)}")
        networks, names = [], []
        for entry in self.hosts or ():
            try:
                networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
            except ValueError:
                names.append(entry.lower().rstrip("."))
        object.__setattr__(self, "_networks", tuple(networks))
        object.__setattr__(self, "_names", tuple(names))

    def allows_host(self, host: str) -> bool:
        if self.hosts is None:
            return True
        try:
            address = ipaddress.ip_address(host.strip("[]").split("%")[0])
        except ValueError:
            name = host.lower().rstrip(".")
            return any(
                name == entry or (entry.startswith("*.") and name.endswith(entry[1:]))
                for entry in self._names
            )
        return any(address in network for network in self._networks)

    def allows_file(self, path: str) -> bool:
        real = Path(os.path.realpath(path))
        if real in _bundled_files():
            return True
        return any(real.is_relative_to(os.path.realpath(root)) for root in self.file_roots)


def _bundled_files() -> set[Path]:
    # By each file's real path: an editable install links them from elsewhere.
    folder = assets_dir()
    return {Path(os.path.realpath(f)) for f in folder.iterdir()} if folder.is_dir() else set()


def validate_source_url(url: str, policy: SourcePolicy | None = None) -> str:
    """Check `url` (against `policy`, if given) and return the string the reader should open.

    Network URLs come back unchanged apart from surrounding whitespace; ``file://`` URLs and
    plain paths come back as absolute local paths. Raises `ValueError` naming the allowed
    schemes for anything else, and for a local file that cannot be used: without a policy
    (a local user's command) saying why; with one, in one message (`REFUSED_FILE`) whether
    the file is outside the policy's roots, missing, not a regular file or unreadable.
    """
    if policy is not None:
        try:
            checked = validate_source_url(url)
        except _UnusableFileError:
            raise ValueError(REFUSED_FILE) from None
        return _check_policy(checked, policy)
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
            raise ValueError(f"file:// URL must name a local file, got host {parts.hostname!r}")
        return _existing_file(unquote(parts.path), text)

    if not text[len(scheme) + 1 :].startswith("//"):
        raise ValueError(
            f"{scheme} URL must look like {scheme}://host[:port]/path, got {redact(url)!r}"
        )
    if not parts.hostname:
        raise ValueError(f"{scheme} URL has no host: {redact(url)!r}")
    try:
        _ = parts.port  # raises ValueError for a port that is not a number in 0..65535
    except ValueError as exc:
        raise ValueError(f"{scheme} URL has an invalid port: {redact(url)!r}") from exc
    return text


def is_local_file(checked: str) -> bool:
    """Whether `checked`, as `validate_source_url` returned it, names a local file (it comes
    back as an absolute path, without a scheme)."""
    return _SCHEME_RE.match(checked) is None


def _check_policy(checked: str, policy: SourcePolicy) -> str:
    match = _SCHEME_RE.match(checked)
    scheme = match.group(1).lower() if match is not None else FILE_SCHEME
    if scheme not in policy.schemes:
        allowed = ", ".join(f"{s}://" for s in policy.schemes)
        raise ValueError(f"source scheme {scheme!r} is not allowed on this server; use {allowed}")
    if scheme == FILE_SCHEME:
        if not policy.allows_file(checked) or not os.access(checked, os.R_OK):
            raise ValueError(REFUSED_FILE)
        return checked
    host = urlsplit(checked).hostname or ""
    if not policy.allows_host(host):
        raise ValueError(f"source host {host!r} is not allowed on this server (source policy)")
    return checked


def ffmpeg_whitelists(url: str) -> dict[str, str]:
    """FFmpeg's own `format_whitelist` and `protocol_whitelist` options for opening `url`."""
    match = _SCHEME_RE.match(url.strip())
    scheme = match.group(1).lower() if match is not None else FILE_SCHEME
    return {
        "format_whitelist": ",".join(VIDEO_DEMUXERS),
        "protocol_whitelist": _PROTOCOLS.get(scheme, "file"),
    }


def is_network_url(url: str) -> bool:
    """True for URLs that name a live network source (EOF there is a failure, not the end)."""
    match = _SCHEME_RE.match(url.strip())
    return match is not None and match.group(1).lower() in NETWORK_SCHEMES


class _UnusableFileError(ValueError):
    """A local path that is not an existing regular file (the message says which)."""


def _existing_file(path: str, original: str) -> str:
    if not path:
        raise ValueError(f"source URL names no file: {original!r}")
    absolute = os.path.abspath(os.path.expanduser(path))
    if not os.path.exists(absolute):
        raise _UnusableFileError(f"source file does not exist: {absolute}")
    if not os.path.isfile(absolute):
        raise _UnusableFileError(f"source path is not a regular file: {absolute}")
    return absolute
