"""Long commands show progress on a terminal (tqdm) and nothing in logs and pipes."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import time

import pytest

from vdet.cli.args import activity, progress

SCRIPT = """
import time
from vdet.cli.args import activity, progress
report = progress("rendering")
for i in range(1, 6):
    report(i, 5)
with activity("building"):
    time.sleep(1.3)
"""


def test_nothing_is_written_when_stderr_is_not_a_terminal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    report = progress("rendering")
    for i in range(1, 4):
        report(i, 3)
    with activity("building"):
        time.sleep(0.05)
    assert capsys.readouterr() == ("", "")


def test_a_terminal_gets_a_bar_and_the_time_taken() -> None:
    master, slave = pty.openpty()
    try:
        done = subprocess.run(
            [sys.executable, "-c", SCRIPT],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=slave,
            timeout=60,
            check=False,
        )
        os.close(slave)
        chunks = []
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the terminal's other end is closed: all read
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(master)
    shown = b"".join(chunks).decode(errors="replace")
    assert done.returncode == 0, shown
    assert "rendering: 100%" in shown and "5/5" in shown
    assert "building: 00:01" in shown
