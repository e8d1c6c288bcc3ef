"""An attacker's session against the installed `vdet serve` on the CPU, case by case, with what
each case cost the server: the same measurements that found the holes closed since.

One server, locked down as the security docs advise: an API key, a source policy allowing
only host 127.0.0.1, `file_roots` on the bundled demo clip's folder, a streams file, and the
demo clip as a paced camera (`demo`). Beside it, in this process:

- the resident set of the server and all its descendants, summed, every 100 ms (/proc);
- GET /healthz every 50 ms on a connection of its own (latency and status);
- a WebSocket client reading every result of `demo` (results per second: the stream keeps
  publishing).

Each case runs in a window of its own; per case the report gives the peak growth of the
resident set over the second before it, what was left 2 s after, /healthz p99 and any
non-200, the demo stream's results/s, the server's 5xx, and the case's own outcome (what was
answered, what was contacted). At the end the streams accepted during the run must all still
be listed and in the streams file. A last case starts a second server on a bad streams file.

Targets (the hardening issue): each case's growth <= 100 MB (uploads: the stated budget of
200 MB peak, 50 MB left), /healthz p99 <= 100 ms, the demo stream publishing, no 5xx, nothing
accepted lost.

    .venv/bin/python bench/security_cases.py --out result.json
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import io
import json
import os
import platform
import re
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import websockets
import yaml
from openapi_spec_validator import validate
from PIL import Image
from websockets.sync.client import connect

from vdet.core.assets import asset_path

KEY = "bench-key-0123456789"
AUTH = {"X-API-Key": KEY}
WS_KEY = f"vdet.api-key.{KEY}"
SECRET = "hunter2-s3cret"
MIN_WINDOW_S = 2.0  # a case over sooner is measured over this long (RSS, /healthz, results)


def _free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class Server:
    """The installed `vdet serve` on a config file, its log in a file."""

    def __init__(self, workdir: Path, config: dict[str, Any]) -> None:
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        config = {"host": "127.0.0.1", "port": self.port, **config}
        path = workdir / f"vdet-{self.port}.yaml"
        path.write_text(yaml.safe_dump(config))
        self.log = workdir / f"serve-{self.port}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("VDET_")}
        vdet = str(Path(sys.executable).parent / "vdet")
        with self.log.open("wb") as log:
            self.popen = subprocess.Popen(
                [vdet, "serve", "--config", str(path)], env=env, stdout=log, stderr=log
            )

    def wait_ready(self, seconds: float = 120) -> None:
        deadline = time.monotonic() + seconds
        while True:
            try:
                if self.request("GET", "/readyz")[0] == 200:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline or self.popen.poll() is not None:
                raise RuntimeError("vdet serve did not become ready:\n" + self.log.read_text())
            time.sleep(0.5)

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.request(method, path, body=body, headers={**AUTH, **(headers or {})})
            answer = conn.getresponse()
            return answer.status, answer.read()
        finally:
            conn.close()

    def stop(self) -> None:
        self.popen.terminate()
        try:
            self.popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.popen.kill()


def _tree_rss_mb(pid: int) -> float:
    """Resident set of `pid` and every descendant, in MB."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        with suppress(OSError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1024
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
    return total


class Monitors:
    """RSS, /healthz and the demo stream's results, sampled on threads until stopped."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.rss: list[tuple[float, float]] = []
        self.health: list[tuple[float, float, int]] = []  # (time, ms, status)
        self.results: list[float] = []
        self.stopped = threading.Event()
        for target in (self._rss, self._health, self._results):
            threading.Thread(target=target, daemon=True).start()

    def _rss(self) -> None:
        while not self.stopped.is_set():
            self.rss.append((time.monotonic(), _tree_rss_mb(self.server.popen.pid)))
            time.sleep(0.1)

    def _health(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=10)
        while not self.stopped.is_set():
            started = time.monotonic()
            try:
                conn.request("GET", "/healthz")
                answer = conn.getresponse()
                answer.read()
                status = answer.status
            except (OSError, http.client.HTTPException):
                status = 0
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=10)
            self.health.append((started, (time.monotonic() - started) * 1e3, status))
            time.sleep(0.05)

    def _results(self) -> None:
        url = f"ws://127.0.0.1:{self.server.port}/v1/streams/demo/events"
        while not self.stopped.is_set():
            with suppress(Exception), connect(url, subprotocols=[WS_KEY]) as ws:  # type: ignore[list-item]
                while not self.stopped.is_set():
                    with suppress(TimeoutError):
                        if '"type":"result"' in str(ws.recv(timeout=1)).replace(" ", ""):
                            self.results.append(time.monotonic())

    def window(self, start: float, end: float) -> dict[str, Any]:
        before = [mb for t, mb in self.rss if start - 1.5 <= t < start] or [self.rss[-1][1]]
        during = [mb for t, mb in self.rss if start <= t <= end] or before
        after = [mb for t, mb in self.rss if end + 1.5 <= t <= end + 2.5] or during[-1:]
        base = statistics.median(before)
        health = [(ms, st) for t, ms, st in self.health if start <= t <= end]
        latencies = sorted(ms for ms, _ in health)
        return {
            "seconds": round(end - start, 2),
            "rss_base_mb": round(base, 1),
            "rss_peak_growth_mb": round(max(during) - base, 1),
            "rss_left_mb": round(statistics.median(after) - base, 1),
            "healthz_p99_ms": round(latencies[int(0.99 * (len(latencies) - 1))], 1)
            if latencies
            else None,
            "healthz_max_ms": round(latencies[-1], 1) if latencies else None,
            "healthz_not_200": sum(1 for _, st in health if st != 200),
            "demo_results_per_s": round(
                sum(1 for t in self.results if start <= t <= end) / max(end - start, 1e-9), 1
            ),
        }


# ---------------------------------------------------------------- the cases


def _send_head(port: int, head_lines: Iterator[bytes]) -> dict[str, Any]:
    """Send a request head piece by piece until the server stops reading; what came back."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.settimeout(20)
    sent = 0
    try:
        for piece in head_lines:
            sock.sendall(piece)
            sent += len(piece)
    except OSError:
        pass
    answer = b""
    with suppress(OSError):
        answer = sock.recv(200)
    sock.close()
    # sent_mb: what the client got into the connection before the server closed it (the
    # kernel's socket buffers on both sides included)
    return {"sent_mb": round(sent / 2**20, 2), "answer": answer.split(b"\r\n")[0].decode()}


def _big_head(mb: int) -> Iterator[bytes]:
    yield b"GET /v1/streams HTTP/1.1\r\nHost: x\r\nX-Pad: "
    chunk = b"a" * 2**20
    for _ in range(mb):
        yield chunk


def _many_lines(count: int) -> Iterator[bytes]:
    yield b"GET /v1/streams HTTP/1.1\r\nHost: x\r\n"
    line = b"X-A: b\r\n"
    for _ in range(count // 1000):
        yield line * 1000


def _parallel(count: int, job: Callable[[], Any]) -> list[Any]:
    out: list[Any] = [None] * count

    def run(i: int) -> None:
        out[i] = job()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def case_heads(server: Server) -> dict[str, Any]:
    one = _send_head(server.port, _big_head(256))
    four = _parallel(4, lambda: _send_head(server.port, _big_head(128)))
    lines = _send_head(server.port, _many_lines(100_000))
    return {"one_256mb": one, "four_128mb": four, "100k_lines": lines}


class _Counter:
    """A TCP listener that only counts who connects: a target that must never be contacted."""

    def __init__(self, host: str) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family)
        self.sock.bind((host, 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()


def _redirector(answer: Callable[[bytes], bytes]) -> int:
    """A server on 127.0.0.1 that reads a request head and answers `answer(head)`."""
    sock = socket.create_server(("127.0.0.1", 0))

    def serve(conn: socket.socket) -> None:
        with conn, suppress(OSError):
            conn.settimeout(10)
            head = b""
            while not head.endswith(b"\r\n\r\n"):
                data = conn.recv(4096)
                if not data:
                    return
                head += data
                if head.endswith(b"\r\n\r\n"):
                    conn.sendall(answer(head))
                    head = b""

    def accept() -> None:
        while True:
            conn, _ = sock.accept()
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return int(sock.getsockname()[1])


def _cseq(head: bytes) -> bytes:
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"cseq:"):
            return line.split(b":", 1)[1].strip()
    return b"1"


def _redirect_reply(scheme: str, location: str) -> Callable[[bytes], bytes]:
    """What a server of `scheme` answers every request with: a 302 to `location`."""
    if scheme == "http":
        reply = f"HTTP/1.1 302 Found\r\nLocation: {location}\r\nContent-Length: 0\r\n\r\n"
        return lambda head: reply.encode()
    return lambda head: (
        b"RTSP/1.0 302 Moved\r\nCSeq: " + _cseq(head) + f"\r\nLocation: {location}\r\n\r\n".encode()
    )


def case_redirects(server: Server) -> dict[str, Any]:
    targets = {"127.0.0.2": _Counter("127.0.0.2"), "127.0.0.1": _Counter("127.0.0.1")}
    with suppress(OSError):
        targets["::1"] = _Counter("::1")
    locations = {
        "127.0.0.2": f"127.0.0.2:{targets['127.0.0.2'].port}",
        "localhost": f"localhost:{targets['127.0.0.1'].port}",
    }
    if "::1" in targets:
        locations["[::1]"] = f"[::1]:{targets['::1'].port}"
    out: dict[str, Any] = {}
    for scheme in ("http", "rtsp"):
        for name, hostport in locations.items():
            location = f"{scheme}://{hostport}/cam"
            port = _redirector(_redirect_reply(scheme, location))
            stream = f"redir-{scheme}-{name.strip('[]').replace(':', '').replace('.', '-')}"
            body = json.dumps({"id": stream, "url": f"{scheme}://127.0.0.1:{port}/cam"})
            status, _ = server.request(
                "POST", "/v1/streams", body.encode(), {"content-type": "application/json"}
            )
            time.sleep(4)  # a first try and a reconnect
            _, text = server.request("GET", f"/v1/streams/{stream}")
            state = json.loads(text)["status"] if status == 201 else {}
            server.request("DELETE", f"/v1/streams/{stream}")
            out[stream] = {
                "post": status,
                "state": state.get("state"),
                "last_error": state.get("last_error"),
                "frames_decoded": state.get("frames_decoded"),
            }
    out["target_connections"] = {h: c.connections for h, c in targets.items()}
    return out


def _png(wh: tuple[int, int]) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", wh, (90, 120, 200)).save(buffer, "PNG", optimize=True)
    return buffer.getvalue()


def case_images(server: Server) -> dict[str, Any]:
    png = _png((4096, 4095))
    statuses: list[int] = []
    for _ in range(3):
        statuses += _parallel(
            4,
            lambda: server.request("POST", "/v1/detect", png, {"content-type": "image/png"})[0],
        )
    return {"png_bytes": len(png), "statuses": sorted(set(statuses)), "uploads": len(statuses)}


ODD_JSON = {
    "conf 1e999": b'{"id":"o1","url":"rtsp://127.0.0.1:9/a","conf_threshold":1e999}',
    "conf NaN": b'{"id":"o2","url":"rtsp://127.0.0.1:9/a","conf_threshold":NaN}',
    "detect_fps Infinity": b'{"id":"o3","url":"rtsp://127.0.0.1:9/a","detect_fps":Infinity}',
    "zone point NaN": b'{"id":"o4","url":"rtsp://127.0.0.1:9/a","zones":[{"id":"z","points"'
    b":[[0,0],[1,NaN],[1,1]]}]}",
    "lone surrogate class": b'{"id":"o5","url":"rtsp://127.0.0.1:9/a","zones":[{"id":"z",'
    b'"points":[[0,0],[1,0],[1,1]],"classes":["\\ud800"]}]}',
    "zone classes [false]": b'{"id":"o6","url":"rtsp://127.0.0.1:9/a","zones":[{"id":"z",'
    b'"points":[[0,0],[1,0],[1,1]],"classes":[false]}]}',
    "max_det true": b'{"id":"o7","url":"rtsp://127.0.0.1:9/a","max_det":true}',
    'conf "0.5"': b'{"id":"o8","url":"rtsp://127.0.0.1:9/a","conf_threshold":"0.5"}',
    "url with trailing space": b'{"id":"o9","url":"rtsp://127.0.0.1:9/a  "}',
}


def case_odd_json(server: Server) -> dict[str, Any]:
    """Each body on one keep-alive connection; after each, /healthz on the same connection."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    out: dict[str, Any] = {}
    for name, body in ODD_JSON.items():
        conn.request("POST", "/v1/streams", body, {**AUTH, "content-type": "application/json"})
        answer = conn.getresponse()
        text = answer.read()
        conn.request("GET", "/healthz")
        kept = conn.getresponse()
        kept.read()
        out[name] = {
            "status": answer.status,
            "detail_bytes": len(text),
            "connection_kept": kept.status == 200,
        }
        if answer.status == 201:
            stream = json.loads(body)["id"]
            out[name]["stored_url"] = json.loads(text)["spec"]["url"]
            server.request("DELETE", f"/v1/streams/{stream}")
    conn.close()
    return out


async def _websockets(port: int, count: int, hold_s: float) -> dict[str, Any]:
    url = f"ws://127.0.0.1:{port}/v1/streams/demo/events"

    async def one() -> Any:
        try:
            return await websockets.connect(url, subprotocols=[WS_KEY], open_timeout=30)  # type: ignore[list-item]
        except websockets.InvalidStatus as exc:
            return exc.response.status_code
        except Exception as exc:
            return type(exc).__name__

    got = await asyncio.gather(*(one() for _ in range(count)))
    opened = [c for c in got if not isinstance(c, (int, str))]
    await asyncio.sleep(hold_s)
    await asyncio.gather(*(c.close() for c in opened), return_exceptions=True)
    refused: dict[str, int] = {}
    for c in got:
        if isinstance(c, (int, str)):
            refused[str(c)] = refused.get(str(c), 0) + 1
    return {"asked": count, "accepted": len(opened), "refused": refused}


def case_websockets(server: Server) -> dict[str, Any]:
    return asyncio.run(_websockets(server.port, 1000, 8.0))


def _idle_viewer(port: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(
        f"GET /v1/streams/demo/live.mjpeg HTTP/1.1\r\nHost: x\r\nX-API-Key: {KEY}\r\n\r\n".encode()
    )
    return sock


def _real_viewer(port: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/v1/streams/demo/live.mjpeg", headers=AUTH)
        answer = conn.getresponse()
        if answer.status == 200:
            answer.read(1000)  # the first part arrives
        return answer.status
    finally:
        conn.close()


def case_idle_viewers(server: Server) -> dict[str, Any]:
    idle = [_idle_viewer(server.port) for _ in range(8)]
    time.sleep(1)
    started = time.monotonic()
    tries: list[int] = []
    while time.monotonic() - started < 60:
        tries.append(_real_viewer(server.port))
        if tries[-1] == 200:
            break
        time.sleep(0.5)
    for sock in idle:
        sock.close()
    return {
        "real_viewer_statuses": sorted(set(tries)),
        "seconds_until_a_real_viewer_got_in": round(time.monotonic() - started, 1),
    }


def case_stalled_uploads(server: Server) -> dict[str, Any]:
    """4 uploads that send 10 bytes of a declared 1 MB and stall; then a real upload."""
    stalled = []
    for _ in range(4):
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.sendall(
            f"POST /v1/detect HTTP/1.1\r\nHost: x\r\nX-API-Key: {KEY}\r\n"
            "Content-Type: image/jpeg\r\nContent-Length: 1000000\r\n\r\n".encode()
            + b"\xff\xd8" * 5
        )
        stalled.append(sock)
    time.sleep(0.5)
    png = _png((640, 480))
    started = time.monotonic()
    statuses = []
    while time.monotonic() - started < 60:
        statuses.append(server.request("POST", "/v1/detect", png, {"content-type": "image/png"})[0])
        if statuses[-1] == 200:
            break
        time.sleep(0.5)
    answers = []
    for sock in stalled:
        sock.settimeout(5)
        with suppress(OSError):
            answers.append(sock.recv(100).split(b"\r\n")[0].decode())
        sock.close()
    return {
        "real_upload_statuses": sorted(set(statuses)),
        "seconds_until_a_real_upload_got_200": round(time.monotonic() - started, 1),
        "stalled_answers": answers,
    }


def case_secrets(server: Server) -> dict[str, Any]:
    url = f"rtsp://127.0.0.1:9/cam?password={SECRET}&token={SECRET}x&size=big"
    body = json.dumps({"id": "secret-cam", "url": url}).encode()
    status, text = server.request("POST", "/v1/streams", body, {"content-type": "application/json"})
    time.sleep(3)  # a failed connection: last_error and the log
    seen = {
        "post_answer": SECRET in text.decode(),
        "get": SECRET in server.request("GET", "/v1/streams/secret-cam")[1].decode(),
        "list": SECRET in server.request("GET", "/v1/streams")[1].decode(),
        "log": SECRET in server.log.read_text(errors="replace"),
    }
    return {"post": status, "stored_as": json.loads(text)["spec"]["url"], "secret_seen_in": seen}


def case_http_details(server: Server) -> dict[str, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("OPTIONS", "/v1/streams")
    options = conn.getresponse()
    options.read()
    conn.close()
    _status, text = server.request("GET", "/openapi.json")
    document = json.loads(text)
    error = None
    try:
        validate(document)
    except Exception as exc:
        error = str(exc)[:200]
    stream_answers = document["paths"]["/v1/streams"]["post"]["responses"]
    return {
        "options": options.status,
        "allow": options.getheader("Allow"),
        "openapi_version": document.get("openapi"),
        "openapi_valid": error is None,
        "openapi_error": error,
        "post_streams_documents": sorted(stream_answers),
    }


def bad_streams_file(workdir: Path) -> dict[str, Any]:
    """A second server on a streams file that is not JSON: one line and exit 2."""
    broken = workdir / "broken-streams.json"
    broken.write_text('{"streams": [ this is not json')
    server = Server(workdir, {"streams_file": str(broken), "log_level": "warning"})
    try:
        code = server.popen.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.stop()
        code = None
    lines = [line for line in server.log.read_text().splitlines() if line.strip()]
    return {"exit_code": code, "lines": len(lines), "first_line": lines[0][:200] if lines else ""}


CASES: dict[str, Callable[[Server], dict[str, Any]]] = {
    "request heads": case_heads,
    "redirects": case_redirects,
    "image memory": case_images,
    "odd and lax JSON": case_odd_json,
    "1000 WebSocket clients": case_websockets,
    "idle MJPEG viewers": case_idle_viewers,
    "stalled uploads": case_stalled_uploads,
    "secrets in queries": case_secrets,
    "OPTIONS and OpenAPI": case_http_details,
}


def _answers(log: Path, since: int) -> dict[str, int]:
    """The statuses of the server's access lines from byte `since` of its log, counted."""
    text = log.read_bytes()[since:].decode(errors="replace")
    counts: dict[str, int] = {}
    for status in re.findall(r'HTTP/1\.1" (\d{3})', text):
        counts[status] = counts.get(status, 0) + 1
    return dict(sorted(counts.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", nargs="*", help="case names (default: all)")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    workdir = Path(tempfile.mkdtemp(prefix="vdet-security-"))
    demo = asset_path("sample.mp4")
    streams_file = workdir / "streams.json"
    server = Server(
        workdir,
        {
            "api_key": KEY,
            "log_level": "info",
            "streams_file": str(streams_file),
            "ingest": {
                "source_policy": {"hosts": ["127.0.0.1"], "file_roots": [str(demo.parent)]},
                "connect_timeout_s": 2.0,
                "backoff_initial_s": 1.0,
                "backoff_max_s": 2.0,
            },
            "sources": [{"id": "demo", "url": str(demo), "loop": True}],
        },
    )
    report: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "python": platform.python_version(),
        "cases": {},
    }
    try:
        server.wait_ready()
        body = json.dumps({"id": "kept", "url": f"rtsp://127.0.0.1:9/kept?password={SECRET}"})
        accepted = server.request(
            "POST", "/v1/streams", body.encode(), {"content-type": "application/json"}
        )[0]
        monitors = Monitors(server)
        time.sleep(5)  # warm: results flowing, a baseline of samples
        report["idle"] = monitors.window(time.monotonic() - 4, time.monotonic())
        for name, case in CASES.items():
            if args.only and name not in args.only:
                continue
            log_at = server.log.stat().st_size
            start = time.monotonic()
            outcome = case(server)
            end = max(time.monotonic(), start + MIN_WINDOW_S)
            time.sleep(end - time.monotonic() + 3)  # what is left after it
            answers = _answers(server.log, log_at)
            entry = {
                **monitors.window(start, end),
                "server_errors": sum(n for s, n in answers.items() if s[0] == "5" and s != "503"),
                "answers": answers,
            }
            entry["outcome"] = outcome
            report["cases"][name] = entry
            print(name, json.dumps(entry)[:400], flush=True)
        monitors.stopped.set()
        listed = json.loads(server.request("GET", "/v1/streams")[1])
        ids = sorted(s["spec"]["id"] for s in listed["streams"])
        stored = json.loads(streams_file.read_text()) if streams_file.exists() else None
        report["accepted_kept"] = {
            "kept_post": accepted,
            "listed": ids,
            "streams_file": sorted(s["id"] for s in stored["streams"]) if stored else None,
        }
    finally:
        server.stop()
    report["bad streams file"] = bad_streams_file(workdir)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report["accepted_kept"]), json.dumps(report["bad streams file"]))


if __name__ == "__main__":
    main()
