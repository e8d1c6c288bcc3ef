"""One thread that reads every worker process's pipe.

The API process used to read each worker's pipe on a thread of its own. Nine reader threads
(eight workers and a spare) then took turns at the GIL with the event loop, and the loop, which
gives the GIL away on every WebSocket send, waited behind them: on a 2-core machine its lag p99
was 28.6 ms with a thread per pipe and 6.8 ms with one thread waiting on all of them (same
load, alternated runs; bench/results/2026-12-03-api-loop-cpu.md). `Inbox` is that one thread.

It waits on every registered pipe at once (`multiprocessing.connection.wait`), reads what has
arrived on a ready pipe with one system call (up to `_READ_BYTES`, so one busy worker cannot
starve the rest), splits it into messages (`MessageSplitter`: a reader that made two calls per
message spent its time waiting to take the GIL back from the event loop) and hands each to the
callback registered with the pipe. A
pipe that reports EOF (its process is gone) is dropped and its `on_closed` callback runs on a
short thread of its own, so a worker's end, which waits for its process, never holds up the
others' results. Messages of one pipe keep their order; there is no order between pipes.

A read never waits for a message to arrive whole: what has come of it is kept until the rest
does, so a worker stopped mid-message holds up nobody but itself.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection, wait

from vdet.workers.channel import Channel, MessageSplitter

log = logging.getLogger(__name__)

# Bytes read from one pipe before the others get their turn: ~100 results of a worker.
_READ_BYTES = 256 * 1024


class _Registered:
    __slots__ = ("channel", "fd", "on_closed", "on_message", "splitter")

    def __init__(
        self,
        channel: Channel,
        on_message: Callable[[object], None],
        on_closed: Callable[[], None],
    ) -> None:
        self.channel = channel
        self.fd = channel.conn.fileno()
        self.on_message = on_message
        self.on_closed = on_closed
        self.splitter = MessageSplitter()


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
        """What has arrived on one pipe; False once it has closed."""
        try:
            data = os.read(registered.fd, _READ_BYTES)  # ready: returns what is there
        except OSError:
            return False
        if not data:
            if registered.splitter.pending:
                log.warning("a worker's pipe closed in the middle of a message")
            return False
        try:
            messages = registered.splitter.feed(data)
        except Exception:  # not our framing or pickle: nothing more of this pipe can be read
            log.exception("a worker's pipe carried something that is not a message")
            return False
        for message in messages:
            try:
                registered.on_message(message)
            except Exception:  # one bad message must not stop every worker's results
                log.exception("handling a message from a worker failed")
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
