"""A relay on the loopback between FFmpeg and one RTSP(S) camera, reading what passes.

FFmpeg's RTSP client hides two things vdet needs: a redirect (it follows any 3xx, on every
connect, wherever `Location:` points) and the RTP sequence numbers of the video (over TCP its
RTP layer checks none, and it exposes none). `RtspRelay` sits between them: FFmpeg opens its
`local_url` (plain RTSP to a port on 127.0.0.1; the relay speaks TLS to the camera for rtsps),
the relay connects to the camera and passes every byte both ways, framing what comes back
(RTSP heads with their Content-Length, `$` interleaved frames).

- `refuse_redirects`: a 3xx answer is replaced by a 502 to FFmpeg, its `Location` kept in
  `location`, both connections closed (the reader checks it against the source policy,
  vdet.ingest.redirects).
- `watch_rtp`: the RTP header of each interleaved frame on an even channel (RTP; odd ones
  carry RTCP) is read: sequence number, marker bit, timestamp. A gap in the sequence is a
  loss on the camera's side of the link (TCP itself loses nothing): a relay or a camera whose
  send queue overflowed dropped packets, possibly inside a picture, which only a decoder's
  concealment flags would tell otherwise, and NVDEC's are out of reach. Each gap is kept as a
  `RtpLoss` at the RTP time of the first picture it can have damaged, counted from the first
  packet of the channel as FFmpeg counts a lone stream's pts (the reader asks FFmpeg for the
  video stream only), so the reader finds the packet it damages by its pts.

The camera sees request URLs naming 127.0.0.1 and the relay's port: RTSP servers route by
path. The relay costs a thread pair per connection and one pass over each read, a slice of
the RTP header per packet.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import re
import socket
import ssl
import threading
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

log = logging.getLogger(__name__)

_MAX_HEAD = 64 * 1024  # an RTSP answer's head; a larger one is not RTSP
_MAX_BODY = 1 << 20  # an RTSP answer body (an SDP is a few kB)
_STATUS_RE = re.compile(rb"^RTSP/\d\.\d (\d{3})")
_RTP_HEADER = 12
# Losses not yet taken by the reader; a reader that stopped asking loses the oldest.
_MAX_LOSSES = 256


@dataclass(frozen=True)
class RtpLoss:
    """Packets lost from the RTP stream: `ticks` is the RTP time (90 kHz for video, counted
    from the channel's first packet) of the first picture the loss can have damaged."""

    ticks: int
    packets: int


class _Sequence:
    """One RTP channel's sequence numbers and unwrapped timestamps."""

    def __init__(self, seq: int, timestamp: int, marker: bool) -> None:
        self.seq = seq
        self.timestamp = timestamp
        self.ticks = 0  # the unwrapped timestamp, from the first packet
        self.marker = marker

    def next(self, seq: int, timestamp: int, marker: bool) -> RtpLoss | None:
        """Take the next packet; the loss before it, if any."""
        lost = (seq - self.seq - 1) & 0xFFFF
        if lost >= 0x8000:  # older than the last (a duplicate or reordering): not counted
            return None
        step = (timestamp - self.timestamp) & 0xFFFFFFFF
        ticks = self.ticks + (step - (1 << 32) if step >= 1 << 31 else step)
        loss = None
        if lost:
            # After a packet that ended its picture (marker) the first damaged picture is
            # this one; else the one the last packet belonged to lost its end.
            loss = RtpLoss(ticks if self.marker else self.ticks, lost)
        self.seq, self.timestamp, self.ticks, self.marker = seq, timestamp, ticks, marker
        return loss


class RtspRelay:
    """Relays one connection between FFmpeg (`local_url`) and the RTSP(S) camera at `url`."""

    def __init__(
        self,
        url: str,
        connect_timeout_s: float,
        *,
        refuse_redirects: bool = True,
        watch_rtp: bool = False,
    ) -> None:
        parts = urlsplit(url)
        self._tls = parts.scheme.lower() == "rtsps"
        self._host = parts.hostname or ""
        self._port = parts.port or (322 if self._tls else 554)
        self._timeout_s = connect_timeout_s
        self.refuse_redirects = refuse_redirects
        self.watch_rtp = watch_rtp
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(connect_timeout_s)
        port = self._listener.getsockname()[1]
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@127.0.0.1:{port}" if userinfo else f"127.0.0.1:{port}"
        self.local_url = urlunsplit(("rtsp", netloc, parts.path, parts.query, ""))
        self.location: str | None = None
        self.packets_lost = 0  # RTP packets missing from the sequence, all channels
        self._losses: collections.deque[RtpLoss] = collections.deque(maxlen=_MAX_LOSSES)
        self._sequences: dict[int, _Sequence] = {}
        self._sockets: list[socket.socket] = []
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rtsp-relay", daemon=True)
        self._thread.start()

    def take_losses(self) -> list[RtpLoss]:
        """The losses seen since the last call (oldest first); any thread."""
        taken: list[RtpLoss] = []
        with contextlib.suppress(IndexError):
            while True:
                taken.append(self._losses.popleft())
        return taken

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
            log.debug("rtsp relay: cannot connect to %s:%d: %s", self._host, self._port, exc)
            self.close()
            return
        self._sockets.append(server)
        if self._closed.is_set():
            self.close()
            return
        upward = threading.Thread(
            target=self._pass_requests, args=(client, server), name="rtsp-relay-up", daemon=True
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
        """Relay the camera's messages to FFmpeg until a refused redirect or the end: RTSP
        answers whole, interleaved frames as they come."""
        buffer = bytearray()
        skip = 0  # bytes of an interleaved frame still to pass on unread
        while data := server.recv(65536):
            buffer += data
            at = 0  # buffer[:at] is framed and goes to FFmpeg
            while at < len(buffer):
                if skip:
                    step = min(skip, len(buffer) - at)
                    at, skip = at + step, skip - step
                    continue
                if buffer[at] == 0x24:  # '$', channel, 16-bit length, the frame
                    if len(buffer) - at < 4:
                        break
                    length = int.from_bytes(buffer[at + 2 : at + 4], "big")
                    if self.watch_rtp and not buffer[at + 1] & 1 and length >= _RTP_HEADER:
                        if len(buffer) - at < 4 + _RTP_HEADER:
                            break
                        self._rtp_header(buffer[at + 1], buffer[at + 4 : at + 4 + _RTP_HEADER])
                    at, skip = at + 4, length
                    continue
                end = buffer.find(b"\r\n\r\n", at)
                if end < 0:
                    if len(buffer) - at > _MAX_HEAD:
                        raise OSError("an RTSP answer head over 64 KiB")
                    break
                head = bytes(buffer[at:end])
                length = _content_length(head)
                if length > _MAX_BODY:
                    raise OSError("an RTSP answer body over 1 MiB")
                if len(buffer) < end + 4 + length:
                    break
                status = _STATUS_RE.match(head)
                if (
                    self.refuse_redirects
                    and status is not None
                    and status.group(1).startswith(b"3")
                ):
                    # Kept before FFmpeg hears the 502: the reader asks right after.
                    self.location = _header(head, b"location") or ""  # "": none said
                    client.sendall(bytes(buffer[:at]) + _refusal(head))
                    return
                at = end + 4 + length
            if at:
                client.sendall(memoryview(buffer)[:at])
                del buffer[:at]

    def _rtp_header(self, channel: int, header: bytearray) -> None:
        if header[0] >> 6 != 2 or 72 <= header[1] & 0x7F <= 76:  # not RTP v2, or RTCP
            return
        seq = int.from_bytes(header[2:4], "big")
        timestamp = int.from_bytes(header[4:8], "big")
        marker = bool(header[1] & 0x80)
        sequence = self._sequences.get(channel)
        if sequence is None:
            self._sequences[channel] = _Sequence(seq, timestamp, marker)
            return
        loss = sequence.next(seq, timestamp, marker)
        if loss is not None:
            self.packets_lost += loss.packets
            self._losses.append(loss)


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
