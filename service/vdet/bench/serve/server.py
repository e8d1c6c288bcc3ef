"""One `vdet serve` under test: started through the installed entry point, always stopped.

The server is the `vdet` console script of the running interpreter's environment, run with a
generated YAML config and the variant's environment, exactly as a user would run it. Stopping
is SIGTERM, then SIGKILL after a timeout; what is reported is the exit code, how long the stop
took, and any process of its tree that outlived it by more than two seconds (an orphan, then
killed: it was started by this benchmark). This module owns the process's lifetime and log,
nothing about measuring.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from vdet.bench.serve import proctree
from vdet.bench.serve.options import ServeBenchUsageError, Variant

_POLL_S = 0.2
_LOG_TAIL_LINES = 30
_ORPHAN_GRACE_S = 2.0


class ServerStartError(RuntimeError):
    """The server exited or did not become ready in time; the message has its log's tail."""


@dataclass(frozen=True)
class ServerExit:
    """How the server ended."""

    exit_code: int | None
    signal_sent: str | None  # None: it had exited on its own
    stop_seconds: float
    orphans: tuple[int, ...]  # PIDs of its tree still alive after it exited (killed since)


def vdet_executable() -> Path:
    """The `vdet` console script of this interpreter's environment."""
    scripts = sysconfig.get_path("scripts")
    found = shutil.which("vdet", path=scripts)
    if found is None:
        raise ServeBenchUsageError(
            f"no `vdet` console script in {scripts}: install vdet into this environment "
            "(pip install -e .) so that the benchmark runs the server as users do"
        )
    return Path(found)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now (the server binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class ServeProcess:
    """A `vdet serve` with `config` (written to `workdir/config.yaml`) and `variant`'s env."""

    variant: Variant
    config: dict[str, Any]
    workdir: Path
    popen: subprocess.Popen[bytes] | None = None
    seen: set[tuple[int, int]] = field(default_factory=set)  # (pid, start time) of its tree

    @property
    def base_url(self) -> str:
        return f"http://{self.config['host']}:{self.config['port']}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "serve.log"

    @property
    def pid(self) -> int:
        assert self.popen is not None, "start() first"
        return self.popen.pid

    def environment(self) -> dict[str, str]:
        """The server's environment: ours without VDET_CONFIG (the config is an argument),
        plus the variant's variables."""
        env = {k: v for k, v in os.environ.items() if k != "VDET_CONFIG"}
        env.update(self.variant.environment())
        return env

    def command(self, *, as_shown: bool = False) -> list[str]:
        """The server's argv; `as_shown`: by names, not by where they lie on this machine."""
        return [
            "vdet" if as_shown else str(vdet_executable()),
            "--log-level",
            "warning",
            "serve",
            "--config",
            "config.yaml" if as_shown else str(self.workdir / "config.yaml"),
            "--no-demo",
        ]

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "config.yaml").write_text(yaml.safe_dump(self.config, sort_keys=False))
        with self.log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.environment(),
                start_new_session=True,  # a Ctrl-C of the benchmark reaches it only through stop()
            )
        self.note_tree()

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def wait_ready(self, timeout_s: float) -> float:
        """Seconds until GET /readyz answered 200; ServerStartError if it exits or times out."""
        assert self.popen is not None, "start() first"
        started = time.monotonic()
        last = "no answer"
        with httpx.Client(base_url=self.base_url, timeout=2.0) as http:
            while time.monotonic() - started < timeout_s:
                if self.popen.poll() is not None:
                    raise ServerStartError(
                        f"vdet serve exited with {self.popen.returncode} before it was ready:\n"
                        f"{self.log_tail()}"
                    )
                try:
                    response = http.get("/readyz")
                    if response.status_code == 200:
                        return time.monotonic() - started
                    last = f"HTTP {response.status_code}: {response.text[:200]}"
                except httpx.HTTPError as exc:
                    last = f"{type(exc).__name__}: {exc}"
                time.sleep(_POLL_S)
        raise ServerStartError(
            f"vdet serve was not ready after {timeout_s:.0f} s (last: {last}):\n{self.log_tail()}"
        )

    def note_tree(self, memory: bool = True) -> proctree.TreeSample:
        """Read the process tree now and remember its PIDs (for the orphan check at stop);
        `memory=False`: CPU only (see proctree.sample_tree)."""
        sample = proctree.sample_tree(self.pid, memory)
        self.seen.update(sample.identities)
        return sample

    def stop(self, timeout_s: float) -> ServerExit:
        """SIGTERM, then SIGKILL after `timeout_s`; then kill any orphan of its tree."""
        assert self.popen is not None, "start() first"
        if self.popen.poll() is None:
            self.note_tree()
        started = time.monotonic()
        sent: str | None = None
        if self.popen.poll() is None:
            sent = "SIGTERM"
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                sent = "SIGKILL"
                self.popen.kill()
                self.popen.wait(timeout=timeout_s)
        stop_seconds = time.monotonic() - started
        others = [i for i in self.seen if i[0] != self.popen.pid]
        # Some children end just after their parent, on their own: multiprocessing's resource
        # tracker reads the end of its pipe, then cleans up what the parent left (more so
        # after a worker was killed). Only what still runs after the grace is an orphan.
        grace_end = time.monotonic() + _ORPHAN_GRACE_S
        orphans = tuple(proctree.alive(others))
        while orphans and time.monotonic() < grace_end:
            time.sleep(_POLL_S / 4)
            orphans = tuple(proctree.alive(others))
        for pid in orphans:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                continue
        return ServerExit(self.popen.returncode, sent, round(stop_seconds, 3), orphans)
