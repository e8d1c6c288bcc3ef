"""One thread that reads every worker process's pipe.

The API process used to read each worker's pipe on a thread of its own. Nine reader threads
(eight workers and a spare) then took turns at the GIL with the event loop, and the loop, which
gives the GIL away on every WebSocket send, waited behind them: on a 2-core machine its lag p99
was 28.6 ms with a thread per pipe and 6.8 ms with one thread waiting on all of them (same
load, alternated runs; bench/results/2026-12-03-api-loop-cpu.md). `Inbox` is that one thread.

It waits on every registered pipe at once (`multiprocessing.connection.wait`), takes up to
`_BURST` messages from a pipe that has data before looking at the others (so one busy worker
cannot starve the rest), and hands each message to the callback registered with the pipe. A
pipe that reports EOF (its process is gone) is dropped and its `on_closed` callback runs on a
short thread of its own, so a worker's end, which waits for its process, never holds up the
others' results. Messages of one pipe keep their order; there is no order between pipes.

A message that has started to arrive is read to its end before the next pipe is looked at. A
worker writes each message in one go, so this waits only while a message is being written; a
worker killed mid-message gives EOF, not a wait.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection, wait

from vdet.workers.channel import Channel

log = logging.getLogger(__name__)

# Messages taken from one pipe before the others get their turn.
_BURST = 64


class _Registered:
    __slots__ = ("channel", "on_closed", "on_message")

    def __init__(
        self,
        channel: Channel,
        on_message: Callable[[object], None],
        on_closed: Callable[[], None],
    ) -> None:
        self.channel = channel
        self.on_message = on_message
        self.on_closed = on_closed


class Inbox:
    """Reads the pipes added to it on one thread, until `close()`."""

    def __init__(self, name: str = "vdet-inbox") -> None:
        self._lock = threading.Lock()
        self._pipes: dict[Connection, _Registered] = {}
        self._closed = False
        # Writing a byte here wakes the thread so that it waits on a pipe added since.
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._wake_write.setblocking(False)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def add(
        self,
        channel: Channel,
        on_message: Callable[[object], None],
        on_closed: Callable[[], None],
    ) -> None:
        """Read `channel` from now on: `on_message(message)` for each message (on the inbox's
        thread, in order), then `on_closed()` once at its EOF (on a thread of its own)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the inbox is closed")
            self._pipes[channel.conn] = _Registered(channel, on_message, on_closed)
        self._wake()

    def close(self) -> None:
        """Stop reading (pipes still open are left to their owners) and end the thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._wake()
        if self._thread is not threading.current_thread():
            self._thread.join(5.0)
        self._wake_read.close()
        self._wake_write.close()

    def _wake(self) -> None:
        # (BlockingIOError: wakes are pending already; OSError: the inbox is closing)
        with contextlib.suppress(BlockingIOError, OSError):
            self._wake_write.send(b"\0")

    def _run(self) -> None:
        while True:
            with self._lock:
                if self._closed:
                    return
                pipes = dict(self._pipes)
            try:
                ready = wait([*pipes, self._wake_read])
            except (OSError, ValueError):  # a pipe closed by its owner while waited on
                self._drop_closed(pipes)
                continue
            for conn in ready:
                if conn is self._wake_read:
                    self._drain_wakes()
                    continue
                registered = pipes[conn]  # type: ignore[index]
                if not self._read_burst(registered):
                    self._drop(conn, registered)  # type: ignore[arg-type]

    def _read_burst(self, registered: _Registered) -> bool:
        """Up to `_BURST` messages of one pipe; False once it has closed."""
        channel = registered.channel
        try:
            for _ in range(_BURST):
                message = channel.recv()
                try:
                    registered.on_message(message)
                except Exception:  # one bad message must not stop every worker's results
                    log.exception("handling a message from a worker failed")
                if not channel.conn.poll():
                    break
        except (EOFError, OSError):
            return False
        return True

    def _drop(self, conn: Connection, registered: _Registered) -> None:
        with self._lock:
            self._pipes.pop(conn, None)
        threading.Thread(target=registered.on_closed, name="vdet-pipe-closed", daemon=True).start()

    def _drop_closed(self, pipes: dict[Connection, _Registered]) -> None:
        for conn, registered in pipes.items():
            if conn.closed:
                self._drop(conn, registered)

    def _drain_wakes(self) -> None:
        try:
            while self._wake_read.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass


__all__ = ["Inbox"]
