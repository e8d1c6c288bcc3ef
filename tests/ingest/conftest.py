"""Fixtures for ingest tests: damaged clips and network peers that misbehave on purpose."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.rtsp import free_port
from support.videos import write_corrupt_copy, write_h264_clip

from vdet.ingest.source_thread import IngestOptions, SourceThread


@pytest.fixture(scope="session")
def corrupt_clip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A faststart clip with garbage inserted and written over, cut short: opens, then errs."""
    folder = tmp_path_factory.mktemp("corrupt")
    source = write_h264_clip(folder / "source.mp4", faststart=True)
    return write_corrupt_copy(source, folder / "corrupt.mp4")


@pytest.fixture
def fast_options() -> IngestOptions:
    """Short timeouts and backoff so that failure paths run in a fraction of a second."""
    return IngestOptions(
        connect_timeout_s=2.0,
        read_timeout_s=2.0,
        stall_timeout_s=1.0,
        backoff_initial_s=0.05,
        backoff_max_s=0.3,
        jitter=0.1,
    )


@pytest.fixture
def closed_port() -> int:
    """A loopback port with no listener: connecting is refused at once."""
    return free_port()


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port that accepts connections and never sends a byte: a hung camera."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.1)
    accepted: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            accepted.append(conn)

    thread = threading.Thread(target=accept, name="silent-peer", daemon=True)
    thread.start()
    yield int(listener.getsockname()[1])
    done.set()
    thread.join(2)
    listener.close()
    for conn in accepted:
        conn.close()


@pytest.fixture
def workers() -> Iterator[list[SourceThread]]:
    """Append the workers a test starts; all are stopped at its end, whatever happened."""
    started: list[SourceThread] = []
    yield started
    for worker in started:
        worker.stop(timeout=5)
