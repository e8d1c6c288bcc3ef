"""The fleet tests' shared fixture: one real NATS JetStream server on loopback per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from support.nats_servers import NatsServer, nats_server_binary, single_server


@pytest.fixture
def server(tmp_path: Path) -> Iterator[NatsServer]:
    nats_server_binary()
    s = single_server(tmp_path / "nats")
    yield s
    s.stop()
