"""A real HTTP endpoint for webhook tests: the standard library's threaded server on a
loopback port, recording every POST; over HTTPS with a certificate and key given."""

from __future__ import annotations

import contextlib
import json
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


class Receiver:
    """An HTTP endpoint that records every POST and answers with `statuses` in turn (then 200),
    after `delay_s`."""

    def __init__(self, tls: tuple[Path, Path] | None = None) -> None:
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.statuses: list[int] = []
        self.delay_s = 0.0
        self.gate = threading.Event()
        self.gate.set()
        self.waiting = 0  # requests held at the gate now
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.waiting += 1
                receiver.gate.wait(10)
                receiver.waiting -= 1
                time.sleep(receiver.delay_s)
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                receiver.requests.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(status)
                if 300 <= status < 400:
                    self.send_header("Location", "http://127.0.0.1:9/elsewhere")
                self.send_header("Content-Length", "2")
                self.end_headers()
                # The sender may have given up waiting (the timeout test).
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(b"ok")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        scheme = "http"
        if tls is not None:
            # A client that refuses the certificate fails the handshake in accept(), an OSError
            # the server ignores: it goes on serving.
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(body) for _, body in self.requests]

    def close(self) -> None:
        self.gate.set()
        self.server.shutdown()
        self.server.server_close()
