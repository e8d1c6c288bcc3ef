"""A real RTSP camera for tests: GStreamer's RTSP server in a subprocess.

`rtsp_server_factory` (a pytest fixture) starts ``tests/support/rtsp_server.py`` under
Debian's ``/usr/bin/python3`` (GStreamer's bindings are installed there, not in the venv;
``RTSP_CAMERA_PYTHON`` names another, such as the packed camera of
bench/gpu/pack_rtsp_camera.sh on a machine without GStreamer), serving an H.264 MP4/MKV,
looped in real time, at ``rtsp://127.0.0.1:<port>/<name>``::

    def test_camera(rtsp_server_factory, h264_clip):
        server = rtsp_server_factory(h264_clip)        # started and accepting connections
        url = server.url
        server.pause(); server.resume()                # it hangs (SIGSTOP), then goes on
        server.kill()                                  # the camera dies (SIGKILL)
        server.start()                                 # ... and comes back on the same port
        lossy = rtsp_server_factory(h264_clip, drop_rtp=(97, 300))  # loses RTP packets

Every server a test started is stopped when the test ends. Without GStreamer's RTSP server
the fixture skips the test, except under CI (``CI`` set), where it fails: CI installs the
packages from ``.ci/system-packages.txt``.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

SYSTEM_PYTHON = os.environ.get("RTSP_CAMERA_PYTHON", "/usr/bin/python3")
SERVER_SCRIPT = Path(__file__).with_name("rtsp_server.py")
_PROBE = (
    "import gi; gi.require_version('Gst', '1.0'); gi.require_version('GstRtspServer', '1.0'); "
    "from gi.repository import Gst, GstRtspServer; Gst.init(None); "
    "assert all(Gst.ElementFactory.find(e) for e in "
    "('qtdemux', 'matroskademux', 'h264parse', 'rtph264pay', 'appsrc', 'appsink'))"
)


def free_port() -> int:
    """A loopback TCP port that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_accepts(port: int, host: str = "127.0.0.1", timeout: float = 0.2) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


@functools.cache
def gstreamer_rtsp_problem() -> str | None:
    """None when the RTSP server can run here, else what is missing."""
    if not os.path.exists(SYSTEM_PYTHON):
        return f"{SYSTEM_PYTHON} not found"
    probe = subprocess.run(
        [SYSTEM_PYTHON, "-c", _PROBE], capture_output=True, text=True, timeout=60, check=False
    )
    if probe.returncode != 0:
        tail = (probe.stderr or probe.stdout).strip().splitlines()[-1:] or ["?"]
        return f"GStreamer RTSP server unusable: {tail[0]} (see .ci/system-packages.txt)"
    return None


class RtspServer:
    """One RTSP server process serving `clip`; can be killed and started again on its port."""

    def __init__(
        self,
        clip: Path,
        *,
        port: int | None = None,
        name: str = "cam",
        drop_rtp: tuple[int, int] | None = None,
        log_dir: Path,
    ) -> None:
        self.clip = clip
        self.port = port or free_port()
        self.name = name
        # (every, after): every `every`-th RTP packet of a session after its first `after`
        # is lost, inside pictures as on a lossy link (rtsp_server.py --drop-rtp).
        self.drop_rtp = drop_rtp
        self.log_path = log_dir / f"rtsp-server-{self.port}.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"rtsp://127.0.0.1:{self.port}/{self.name}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, ready_timeout: float = 20.0) -> RtspServer:
        """Start (or start again) and wait until the port accepts connections."""
        if self.running:
            raise RuntimeError(f"RTSP server on port {self.port} is already running")
        deadline = time.monotonic() + ready_timeout
        # A killed server's port can be reported busy for a moment; retry until the deadline.
        while True:
            with self.log_path.open("ab") as log:
                self._process = subprocess.Popen(
                    [
                        SYSTEM_PYTHON,
                        str(SERVER_SCRIPT),
                        "--file",
                        str(self.clip),
                        "--port",
                        str(self.port),
                        "--name",
                        self.name,
                        *(
                            ["--drop-rtp", *map(str, self.drop_rtp)]
                            if self.drop_rtp is not None
                            else []
                        ),
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            while time.monotonic() < deadline:
                if self._process.poll() is not None:
                    break
                if port_accepts(self.port):
                    return self
                time.sleep(0.05)
            returncode = self._process.poll()
            # 2: the port could not be bound (yet); anything else will not get better.
            if returncode != 2 or time.monotonic() >= deadline:
                self.kill()
                raise RuntimeError(
                    f"RTSP server did not accept connections on port {self.port} within "
                    f"{ready_timeout} s:\n{self.log_tail()}"
                )
            time.sleep(0.2)

    def kill(self) -> None:
        """SIGKILL: the camera vanishes without closing its sessions."""
        self._end(signal.SIGKILL)

    def terminate(self) -> None:
        """SIGTERM: a clean shutdown."""
        self._end(signal.SIGTERM)

    def pause(self) -> None:
        """SIGSTOP: connections stay open but nothing is sent or answered, a hung camera."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after `pause`."""
        self._signal(signal.SIGCONT)

    def _signal(self, sig: signal.Signals) -> None:
        if not self.running:
            raise RuntimeError(f"RTSP server on port {self.port} is not running")
        assert self._process is not None
        self._process.send_signal(sig)

    def _end(self, sig: signal.Signals) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(sig)
        process.send_signal(signal.SIGCONT)  # a paused process acts on SIGTERM only when resumed
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


RtspServerFactory = Callable[..., RtspServer]


@pytest.fixture
def rtsp_server_factory(tmp_path: Path) -> Iterator[RtspServerFactory]:
    """Call with a clip path (and optional port=, name=, drop_rtp=) to get a started
    `RtspServer`."""
    problem = gstreamer_rtsp_problem()
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(problem)
        pytest.skip(problem)
    servers: list[RtspServer] = []

    def start(
        clip: Path,
        *,
        port: int | None = None,
        name: str = "cam",
        drop_rtp: tuple[int, int] | None = None,
    ) -> RtspServer:
        server = RtspServer(clip, port=port, name=name, drop_rtp=drop_rtp, log_dir=tmp_path)
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.terminate()
