"""Real servers on loopback addresses for redirect tests: an HTTP server that answers 302 or
serves a file, an RTSP server that answers every request 302, and a listener that records
who connected to it (a target that must never be contacted)."""

from __future__ import annotations

import contextlib
import http.server
import socket
import socketserver
import threading
from collections.abc import Callable
from pathlib import Path


class _Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True


class Listener:
    """A TCP listener at `host` that accepts and counts connections (and says nothing)."""

    def __init__(self, host: str) -> None:
        self.sock = socket.create_server((host, 0))
        self.host, self.port = host, self.sock.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()


def http_server(host: str, answer: Callable[[str], tuple[int, str | None, Path | None]]) -> str:
    """Start an HTTP server at `host`; `answer(path)` gives (status, Location, file to send).
    Returns its base URL; the server runs (daemon threads) until the process ends."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, location, body = answer(self.path)
            self.send_response(status)
            if location is not None:
                self.send_header("Location", location)
            data = body.read_bytes() if body is not None else b""
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Content-Type", "video/mp4")
            self.end_headers()
            with contextlib.suppress(OSError):  # the client may hang up first
                self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = _Server((host, 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://{host}:{server.server_address[1]}"


def rtsp_redirector(host: str, location: str) -> str:
    """Start an RTSP server at `host` answering every request `302 Location: <location>`;
    returns its URL."""

    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            while True:
                cseq = "0"
                while (line := self.rfile.readline()) not in (b"\r\n", b"\n", b""):
                    key, _, value = line.decode("latin-1").partition(":")
                    if key.strip().lower() == "cseq":
                        cseq = value.strip()
                if not line:
                    return
                self.wfile.write(
                    f"RTSP/1.0 302 Moved Temporarily\r\nCSeq: {cseq}\r\n"
                    f"Location: {location}\r\nContent-Length: 0\r\n\r\n".encode()
                )

    server = _Server((host, 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"rtsp://{host}:{server.server_address[1]}/cam"
