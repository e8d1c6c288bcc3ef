"""Where the API process reads every worker process's pipe: on its event loop, or on one thread.

The API process used to read each worker's pipe on a thread of its own. Nine reader threads
(eight workers and a spare) then took turns at the GIL with the event loop, and the loop, which
gives the GIL away on every WebSocket send, waited behind them (its lag p99 about four times
that with one thread for all).
One reader thread is still a second thread: whenever the loop was busy in Python (a /metrics
scrape, a burst of sends) the reader waited up to the GIL's 5 ms switch interval for each of its
system calls, results stopped reaching the hub, and every client saw them late at once.

So `vdet serve` reads the pipes on the event loop itself (`Inbox(loop=...)`, through
`loop.add_reader`): no thread of its data path competes with another for the GIL. Without a
loop (a `WorkerPool` used from plain Python, as tests and benchmarks do) one thread waits on
every pipe at once (`multiprocessing.connection.wait`). Either way a ready pipe is read with one
system call (up to `_READ_BYTES`, so one busy worker cannot starve the rest), what was read is
split into messages (`MessageSplitter`) and each is handed to the callback registered with the
pipe. A pipe at EOF (its process is gone) is dropped and its `on_closed` callback runs on a
short thread of its own, so a worker's end, which waits for its process, never holds up the
others' results. Messages of one pipe keep their order; there is no order between pipes.

A read never waits for a message to arrive whole: what has come of it is kept until the rest
does, so a worker stopped mid-message holds up nobody but itself.
"""

from __future__ import annotations

import asyncio
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
# How long close() waits for the loop to stop watching the pipes (a loop that is not running
# any more never will).
_UNWATCH_WAIT_S = 2.0


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
    """Reads the pipes added to it, on `loop` when given (else on a thread), until `close()`."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop | None = None, name: str = "vdet-inbox"
    ) -> None:
        self._lock = threading.Lock()
        self._pipes: dict[Connection, _Registered] = {}
        self._closed = False
        self._loop = loop
        self._thread: threading.Thread | None = None
        if loop is None:
            # Writing a byte here wakes the thread so that it waits on a pipe added since.
            self._wake_read, self._wake_write = socket.socketpair()
            self._wake_read.setblocking(False)
            self._wake_write.setblocking(False)
            self._thread = threading.Thread(target=self._run, name=name, daemon=True)
            self._thread.start()

    @property
    def on_loop(self) -> bool:
        """Whether the pipes are read on an event loop (else on the inbox's own thread)."""
        return self._loop is not None

    def add(
        self,
        channel: Channel,
        on_message: Callable[[object], None],
        on_closed: Callable[[], None],
    ) -> None:
        """Read `channel` from now on: `on_message(message)` for each message (on the loop or
        the inbox's thread, in order), then `on_closed()` once at its EOF (on a thread of its
        own). Callable from any thread."""
        registered = _Registered(channel, on_message, on_closed)
        with self._lock:
            if self._closed:
                raise RuntimeError("the inbox is closed")
            self._pipes[channel.conn] = registered
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._watch, registered)
        else:
            self._wake()

    def close(self) -> None:
        """Stop reading (pipes still open are left to their owners). Callable from any thread;
        idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pipes = list(self._pipes.values())
        if self._loop is not None:
            # Waited for (from another thread): the pipes' owners close them next, and a
            # descriptor must leave the loop before it is closed (or its number reused).
            unwatched = threading.Event()

            def unwatch() -> None:
                self._unwatch_all(pipes)
                unwatched.set()

            try:
                on_loop = asyncio.get_running_loop() is self._loop
            except RuntimeError:
                on_loop = False
            if on_loop:
                unwatch()
                return
            try:
                self._loop.call_soon_threadsafe(unwatch)
            except RuntimeError:  # the loop has closed: nothing is watched any more
                return
            unwatched.wait(_UNWATCH_WAIT_S)
            return
        self._wake()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5.0)
        self._wake_read.close()
        self._wake_write.close()

    # --- on the event loop ----------------------------------------------------------------

    def _watch(self, registered: _Registered) -> None:
        with self._lock:
            if self._closed or registered.channel.conn not in self._pipes:
                return
        assert self._loop is not None
        self._loop.add_reader(registered.fd, self._on_readable, registered)

    def _on_readable(self, registered: _Registered) -> None:
        if not self._read_burst(registered):
            assert self._loop is not None
            self._loop.remove_reader(registered.fd)
            self._drop(registered)

    def _unwatch_all(self, pipes: list[_Registered]) -> None:
        assert self._loop is not None
        for registered in pipes:
            with contextlib.suppress(OSError, ValueError):  # its pipe was closed already
                self._loop.remove_reader(registered.fd)

    # --- on the inbox's own thread ----------------------------------------------------------

    def _wake(self) -> None:
        # (BlockingIOError: wakes are pending already; OSError: the inbox is closing)
        with contextlib.suppress(BlockingIOError, OSError):
            self._wake_write.send(b"\0")

    def _run(self) -> None:
        while True:
            with self._lock:
                if self._closed:
                    return
                pipes = {conn: r for conn, r in self._pipes.items()}
            try:
                ready = wait([*pipes, self._wake_read])
            except (OSError, ValueError):  # a pipe closed by its owner while waited on
                for conn, registered in pipes.items():
                    if conn.closed:
                        self._drop(registered)
                continue
            for handle in ready:
                if handle is self._wake_read:
                    self._drain_wakes()
                    continue
                registered = pipes[handle]  # type: ignore[index]
                if not self._read_burst(registered):
                    self._drop(registered)

    def _drain_wakes(self) -> None:
        try:
            while self._wake_read.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass

    # --- either way -----------------------------------------------------------------------

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

    def _drop(self, registered: _Registered) -> None:
        with self._lock:
            self._pipes.pop(registered.channel.conn, None)
        threading.Thread(target=registered.on_closed, name="vdet-pipe-closed", daemon=True).start()


__all__ = ["Inbox"]
