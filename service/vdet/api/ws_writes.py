"""WebSocket frames written to the socket once per event-loop pass, not once per message.

uvicorn's WebSocket protocol writes every frame to its transport as soon as the app sends it, and an
idle asyncio transport sends each write to the socket at once: one system call per message per
client. /v1/events at a node's load is thousands of results a second to each client, and those calls
were the largest single cost of the API process's event loop. Here the transport under the protocol
keeps what is written during one pass of the loop and hands it to the real transport in one write at
the start of the next pass (or at once past `FLUSH_BYTES`). Each message is still its own frame, in
the same order, so clients see exactly what they saw before; a message waits at most for the rest of
the loop pass that sent it.

Everything the protocol writes goes through the same buffer (data, pings, pongs, close
frames), so frames keep their order; closing writes what is buffered first. Flow control is
the real transport's: its high-water mark sees the joined writes and pauses the protocol as
before.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any, cast

log = logging.getLogger(__name__)

# Past this many buffered bytes a write goes out at once, so that a burst of replayed results
# reaches the socket (and the transport's flow control) in pieces of a bounded size.
FLUSH_BYTES = 64 * 1024


class CoalescingTransport(asyncio.Transport):
    """A transport that buffers writes made during one loop pass and writes them to `inner`
    as one, at the next pass. Every other call is `inner`'s."""

    def __init__(self, inner: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._inner = inner
        self._loop = loop
        self._pending: list[bytes | bytearray | memoryview] = []
        self._pending_bytes = 0
        self._scheduled = False

    # --- writing ---------------------------------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        self._pending.append(data)
        self._pending_bytes += len(data)
        if self._pending_bytes >= FLUSH_BYTES:
            self.flush()
        elif not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._flush_scheduled)

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        for data in list_of_data:
            self.write(data)

    def _flush_scheduled(self) -> None:
        self._scheduled = False
        self.flush()

    def flush(self) -> None:
        """Hand what is buffered to the real transport now."""
        if not self._pending:
            return
        pending, self._pending, self._pending_bytes = self._pending, [], 0
        if self._inner.is_closing():
            return  # closed under us (the peer went away): nobody to write to
        self._inner.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def write_eof(self) -> None:
        self.flush()
        self._inner.write_eof()

    def can_write_eof(self) -> bool:
        return self._inner.can_write_eof()

    def get_write_buffer_size(self) -> int:
        return self._pending_bytes + self._inner.get_write_buffer_size()

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._inner.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._inner.set_write_buffer_limits(high, low)

    # --- closing ---------------------------------------------------------------------------

    def close(self) -> None:
        self.flush()  # a close frame written just before must go out first
        self._inner.close()

    def abort(self) -> None:
        self._pending, self._pending_bytes = [], 0
        self._inner.abort()

    def is_closing(self) -> bool:
        return self._inner.is_closing()

    # --- the rest is the real transport's ----------------------------------------------------

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._inner.get_extra_info(name, default)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._inner.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._inner.get_protocol()

    def is_reading(self) -> bool:
        return self._inner.is_reading()

    def pause_reading(self) -> None:
        self._inner.pause_reading()

    def resume_reading(self) -> None:
        self._inner.resume_reading()


def websocket_protocol() -> type[asyncio.Protocol] | str:
    """uvicorn's `ws` setting: its websockets (sans-I/O) protocol over a `CoalescingTransport`.

    Without the websockets package this is "auto" (uvicorn picks what it has, writing each
    frame at once) and a warning says so.
    """
    try:
        from uvicorn.protocols.websockets.websockets_sansio_impl import (
            WebSocketsSansIOProtocol,
        )
    except ImportError:
        log.warning("websockets is not installed: WebSocket frames are written one at a time")
        return "auto"

    class CoalescingWebSocketProtocol(WebSocketsSansIOProtocol):
        """uvicorn's protocol, writing through a `CoalescingTransport`."""

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            # (uvloop's transports are not asyncio.Transport subclasses: no isinstance check)
            self.transport = CoalescingTransport(cast(asyncio.Transport, transport), self.loop)

    return CoalescingWebSocketProtocol
