"""Redirects of network sources, held to the source policy hop by hop.

FFmpeg follows an HTTP 3xx (up to 8 by default) and an RTSP 3xx (any number, on every connect,
no option turns it off) to wherever `Location:` points, so a source at an allowed host could
send vdet to any other. With a source policy, vdet therefore never lets FFmpeg follow one:

- HTTP(S): FFmpeg gets `max_redirects=0` and fails on a 3xx; the reader then asks the same
  (allowed) URL itself (`http_location`: one GET, its head read, the connection closed) for
  the `Location`.
- RTSP(S): FFmpeg talks to the camera through an `RtspGuard`, a relay on the loopback that
  passes every byte but a 3xx answer: that one it keeps (its `Location`), answers FFmpeg
  502 in its place and closes both connections.

The reader checks the `Location` (`check_redirect`: the same scheme family, no downgrade
from TLS, the policy's schemes and hosts) and only then connects to it, up to
`max_redirects` hops. A refused target is never contacted. Without host restrictions in the
policy RTSP goes to the camera directly (no relay; FFmpeg's protocol whitelist still keeps
its redirects within RTSP over TCP), because then every host is allowed anyway.
"""

from __future__ import annotations

import contextlib
import logging
import re
import socket
import ssl
import threading
from urllib.parse import urljoin, urlsplit, urlunsplit

import httpx

from vdet.core.redact import redact
from vdet.ingest.urls import SourcePolicy, validate_source_url

log = logging.getLogger(__name__)

_FAMILIES = {"http": "http", "https": "http", "rtsp": "rtsp", "rtsps": "rtsp"}
_MAX_HEAD = 64 * 1024  # an RTSP answer's head; a larger one is not RTSP
_MAX_BODY = 1 << 20  # an RTSP answer's body (an SDP is a few kB)
_STATUS_RE = re.compile(rb"^RTSP/\d\.\d (\d{3})")


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


class RtspGuard:
    """A relay between FFmpeg and one RTSP(S) server that lets no redirect through.

    `local_url` is what FFmpeg opens: plain RTSP to a port on 127.0.0.1 (the guard speaks TLS
    to the server for rtsps). The guard takes the first connection to it, connects to the
    server, and relays both ways; each message from the server is framed (RTSP heads with
    their Content-Length, `$` interleaved frames), and a 3xx answer is replaced by a 502 to
    FFmpeg, its `Location` kept in `location`, both connections closed. The server sees request
    URLs naming 127.0.0.1 and the guard's port: RTSP servers route by path.
    """

    def __init__(self, url: str, connect_timeout_s: float) -> None:
        parts = urlsplit(url)
        self._tls = parts.scheme.lower() == "rtsps"
        self._host = parts.hostname or ""
        self._port = parts.port or (322 if self._tls else 554)
        self._timeout_s = connect_timeout_s
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(connect_timeout_s)
        port = self._listener.getsockname()[1]
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@127.0.0.1:{port}" if userinfo else f"127.0.0.1:{port}"
        self.local_url = urlunsplit(("rtsp", netloc, parts.path, parts.query, ""))
        self.location: str | None = None
        self._sockets: list[socket.socket] = []
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rtsp-guard", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Close the listener and both connections; the relay threads end. Idempotent."""
        self._closed.set()
        for sock in [self._listener, *self._sockets]:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _run(self) -> None:
        try:
            client, _ = self._listener.accept()
        except OSError:
            return  # closed, or FFmpeg never came
        finally:
            self._listener.close()
        self._sockets.append(client)
        try:
            server = socket.create_connection((self._host, self._port), self._timeout_s)
            if self._tls:
                context = ssl.create_default_context()
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE  # as FFmpeg's own TLS (tls_verify=0)
                server = context.wrap_socket(server, server_hostname=self._host)
            server.settimeout(None)
        except OSError as exc:
            log.debug("rtsp guard: cannot connect to %s:%d: %s", self._host, self._port, exc)
            self.close()
            return
        self._sockets.append(server)
        if self._closed.is_set():
            self.close()
            return
        upward = threading.Thread(
            target=self._pass_requests, args=(client, server), name="rtsp-guard-up", daemon=True
        )
        upward.start()
        try:
            self._pass_answers(server, client)
        except OSError:
            pass
        finally:
            self.close()

    def _pass_requests(self, client: socket.socket, server: socket.socket) -> None:
        try:
            while data := client.recv(65536):
                server.sendall(data)
        except OSError:
            pass
        finally:
            self.close()

    def _pass_answers(self, server: socket.socket, client: socket.socket) -> None:
        """Relay the server's messages to FFmpeg, whole, until a redirect or the end."""
        buffer = b""
        skip = 0  # bytes of an interleaved frame still to pass on unread
        while data := server.recv(65536):
            buffer += data
            out: list[bytes] = []
            while buffer:
                if skip:
                    part, buffer = buffer[:skip], buffer[skip:]
                    out.append(part)
                    skip -= len(part)
                    continue
                if buffer[:1] == b"$":  # interleaved RTP/RTCP: '$', channel, 16-bit length
                    if len(buffer) < 4:
                        break
                    skip = 4 + int.from_bytes(buffer[2:4], "big")
                    continue
                end = buffer.find(b"\r\n\r\n")
                if end < 0:
                    if len(buffer) > _MAX_HEAD:
                        raise OSError("an RTSP answer head over 64 KiB")
                    break
                head = buffer[:end]
                length = _content_length(head)
                if length > _MAX_BODY:
                    raise OSError("an RTSP answer body over 1 MiB")
                if len(buffer) < end + 4 + length:
                    break
                status = _STATUS_RE.match(head)
                if status is not None and status.group(1).startswith(b"3"):
                    # Kept before FFmpeg hears the 502: the reader asks right after.
                    self.location = _header(head, b"location") or ""  # "": none said
                    client.sendall(b"".join(out) + _refusal(head))
                    return
                out.append(buffer[: end + 4 + length])
                buffer = buffer[end + 4 + length :]
            if out:
                client.sendall(b"".join(out))


def _header(head: bytes, name: bytes) -> str | None:
    for line in head.split(b"\r\n")[1:]:
        key, sep, value = line.partition(b":")
        if sep and key.strip().lower() == name:
            return value.strip().decode("latin-1")
    return None


def _content_length(head: bytes) -> int:
    value = _header(head, b"content-length")
    try:
        return max(0, int(value)) if value is not None else 0
    except ValueError:
        raise OSError("an RTSP answer with an invalid Content-Length") from None


def _refusal(head: bytes) -> bytes:
    """What FFmpeg gets instead of a redirect: 502, with the answer's CSeq so that it is
    taken as the answer to its request."""
    cseq = "".join(ch for ch in _header(head, b"cseq") or "" if ch.isdigit())[:10] or "0"
    return f"RTSP/1.0 502 Bad Gateway\r\nCSeq: {cseq}\r\nContent-Length: 0\r\n\r\n".encode(
        "latin-1"
    )
