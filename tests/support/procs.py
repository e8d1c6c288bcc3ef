"""Long-running helper processes for tests (vdet serve, Prometheus): start, wait, stop, log."""

from __future__ import annotations

import json
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any


class Process:
    """A subprocess whose stdout and stderr go to `log_path`; `stop()` ends it for sure."""

    def __init__(
        self, args: Sequence[str], log_path: Path, env: dict[str, str] | None = None
    ) -> None:
        self.args = list(args)
        self.log_path = log_path
        with log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                self.args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env
            )

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 15.0) -> None:
        if not self.alive():
            return
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=timeout)


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """Status and body of a GET; HTTP errors are returned, connection errors raised."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), bytes(exc.read())


def http_json(url: str, timeout: float = 5.0) -> Any:
    status, body = http_get(url, timeout)
    if status != 200:
        raise AssertionError(f"GET {url}: HTTP {status}: {body[:500]!r}")
    return json.loads(body)


def wait_http_ok(process: Process, url: str, timeout: float) -> None:
    """Wait until GET `url` answers 200; fail early, with the log, if the process exits."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        if not process.alive():
            raise AssertionError(
                f"{process.args[0]} exited with {process.popen.returncode} before {url} "
                f"answered:\n{process.log_tail()}"
            )
        try:
            status, body = http_get(url, timeout=2.0)
            if status == 200:
                return
            last = f"HTTP {status}: {body[:200]!r}"
        except OSError as exc:
            last = str(exc)
        time.sleep(0.2)
    raise AssertionError(f"{url} not ready after {timeout} s ({last}):\n{process.log_tail()}")
