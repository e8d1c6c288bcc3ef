"""WebSocket event feeds: /v1/streams/{id}/events (one stream) and /v1/events (all streams).

Protocol (server -> client JSON text messages; client messages are read and ignored):

1. `?after=<seq>` (optional, >= 0): if results after that seq have already left the replay
   buffer, `{"type": "gap", "requested_after": <seq>, "oldest_seq": <n | null>}` comes first
   (also when the seq is newer than anything here, i.e. from before a server restart).
2. `{"type": "result", "result": {...}}` for every kept result with seq > after, oldest first,
   then every new result as it is published: no gaps and no duplicates, so a client that
   reconnects with after=<last seq it saw> continues exactly where it stopped.
   Without `after`, only results published after the connection are sent.
3. Before the server closes: `{"type": "lagging" | "stream_removed" | "shutdown",
   "resume_after": <last seq sent>}`, with close codes 1013 (client too slow: its queue
   filled up, or one message took longer than `hub.send_timeout_s` to go out; reconnect
   with after=resume_after), 1000 (stream deleted) and 1001 (shutdown; `vdet serve` sends
   it before uvicorn closes connections, see vdet.api.server). A client that reads nothing
   for another `hub.send_timeout_s` after its send timed out cannot be told: it is
   disconnected without a message and resumes from the last seq it read.

Handshake refusals are HTTP responses with a JSON `detail`: 401 (API key), 404 (unknown
stream), 422 (bad `after`), 503 (not ready, or the clients' cap reached: see
vdet.api.ws_seats); servers without the WebSocket denial-response
extension close with 1008 / 4404 / 1003 / 1013 instead.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from typing import Literal

from fastapi import APIRouter, WebSocket, WebSocketDisconnect, status
from fastapi.responses import JSONResponse
from starlette.websockets import WebSocketDisconnected

from vdet.api.auth import websocket_auth
from vdet.api.deps import service_of
from vdet.api.schemas import EndEvent, GapEvent
from vdet.api.ws_seats import Seats
from vdet.results.hub import Subscription, SubscriptionEnd, SubscriptionEndedError
from vdet.results.wire import ResultEventEncoder
from vdet.root import Service

router = APIRouter()

_CLOSE_CODES = {
    status.HTTP_401_UNAUTHORIZED: status.WS_1008_POLICY_VIOLATION,
    status.HTTP_404_NOT_FOUND: 4404,
    status.HTTP_422_UNPROCESSABLE_CONTENT: status.WS_1003_UNSUPPORTED_DATA,
    status.HTTP_503_SERVICE_UNAVAILABLE: status.WS_1013_TRY_AGAIN_LATER,
}
# Replays are encoded by at most two threads: however many clients ask for one at once, the
# event loop competes for the GIL with no more than two encoders.
_REPLAY_ENCODERS = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="ws-replay")
_REPLAY_CHUNK = 64
EndKind = Literal["lagging", "stream_removed", "shutdown"]
_END: dict[SubscriptionEnd, tuple[EndKind, int]] = {
    SubscriptionEnd.LAGGING: ("lagging", status.WS_1013_TRY_AGAIN_LATER),
    SubscriptionEnd.SOURCE_REMOVED: ("stream_removed", status.WS_1000_NORMAL_CLOSURE),
    SubscriptionEnd.CLOSED: ("shutdown", status.WS_1001_GOING_AWAY),
}


@router.websocket("/v1/streams/{stream_id}/events")
async def stream_events(websocket: WebSocket, stream_id: str) -> None:
    await _serve(websocket, stream_id)


@router.websocket("/v1/events")
async def all_events(websocket: WebSocket) -> None:
    await _serve(websocket, None)


async def _deny(ws: WebSocket, code: int, detail: str) -> None:
    if "websocket.http.response" in ws.scope.get("extensions", {}):
        await ws.send_denial_response(JSONResponse({"detail": detail}, status_code=code))
    else:
        await ws.close(_CLOSE_CODES[code], reason=detail[:120])


def _parse_after(raw: str | None) -> int | None:
    if raw is None:
        return None
    after = int(raw)  # ValueError for junk
    if after < 0:
        raise ValueError(after)
    return after


async def _serve(ws: WebSocket, source_id: str | None) -> None:
    service = service_of(ws)
    authorised, subprotocol = websocket_auth(ws)
    if not authorised:
        await _deny(ws, status.HTTP_401_UNAUTHORIZED, "missing or invalid API key")
        return
    streams = service.streams
    if not service.ready or streams is None:
        await _deny(ws, status.HTTP_503_SERVICE_UNAVAILABLE, "the service is not ready")
        return
    try:
        after = _parse_after(ws.query_params.get("after"))
    except ValueError:
        await _deny(
            ws, status.HTTP_422_UNPROCESSABLE_CONTENT, "'after' must be an integer seq >= 0"
        )
        return

    # Subscribe before accepting so that nothing published during the handshake is missed,
    # and before checking the stream exists, so that a removal after the check still ends
    # this subscription (the hub ends the subscriptions of a source when it is removed).
    sub = service.hub.subscribe(source_id, after)
    if source_id is not None and not service.has_stream(source_id):
        sub.close()
        await _deny(ws, status.HTTP_404_NOT_FOUND, f"no stream {source_id!r}")
        return
    seats: Seats = ws.app.state.websocket_seats
    if (refusal := seats.take(source_id)) is not None:
        sub.close()
        await _deny(ws, status.HTTP_503_SERVICE_UNAVAILABLE, refusal)
        return
    service.metrics.websocket_clients.inc()
    try:
        await ws.accept(subprotocol)
        reader = asyncio.create_task(_drain(ws))
        writer = asyncio.create_task(_send_events(ws, service, sub, after))
        _, pending = await asyncio.wait({reader, writer}, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError, WebSocketDisconnect):
                await task
        if reader.done() and not reader.cancelled():
            reader.exception()  # retrieved: a failed read just means the client is gone
        if writer.done() and not writer.cancelled():
            # The client going away mid-send is normal; anything else is a bug to surface.
            exc = writer.exception()
            gone = (WebSocketDisconnect, WebSocketDisconnected, OSError)
            if exc is not None and not isinstance(exc, gone):
                raise exc
    except WebSocketDisconnect:
        pass
    finally:
        sub.close()
        seats.give_back(source_id)
        service.metrics.websocket_clients.dec()


async def _drain(ws: WebSocket) -> None:
    """Read (and ignore) client messages; returns when the client disconnects."""
    while True:
        message = await ws.receive()
        if message["type"] == "websocket.disconnect":
            return


class _ClientTooSlowError(Exception):
    """A message took longer than the send timeout to go out: the client is not reading."""


async def _send_events(
    ws: WebSocket, service: Service, sub: Subscription, after: int | None
) -> None:
    """Replay, then live results; ends with a goodbye (`lagging`, `stream_removed`,
    `shutdown`) carrying the resume point.

    A message still going out after `hub.send_timeout_s` makes the client `lagging`, before
    the keepalive ping would cut it without one. uvicorn writes nothing to a connection whose
    buffer is full, so that message cannot be abandoned (it was not written) and `lagging` can
    only follow it: the send is left running for one more timeout. If it goes out (the client
    reads again), it counts as sent and the goodbye follows; if not, this task is cancelled and
    the client is dropped without a word (it resumes from the last seq it read).

    This runs for every result and every client, so a send only notes when it started; one
    watchdog timer per client looks at that four times per timeout (a timer armed and
    cancelled per message cost about a tenth of the loop's time at thousands of messages a
    second). A stuck send is therefore noticed between 1 and 1.25 timeouts after it began.
    """
    last_sent = after if after is not None else sub.start_seq
    timeout_s = service.settings.hub.send_timeout_s
    loop = asyncio.get_running_loop()
    this_task = asyncio.current_task()
    assert this_task is not None
    sending_since = 0.0  # loop time the send in flight began; 0.0 while none is
    slow = False  # a send has timed out: the client is lagging
    watchdog: asyncio.TimerHandle

    def watch() -> None:
        nonlocal watchdog, slow
        if sending_since and loop.time() - sending_since >= timeout_s:
            slow = True
            sub.close()  # nothing more is queued for this client
            watchdog = loop.call_later(timeout_s, this_task.cancel)  # it gets one more timeout
            return
        watchdog = loop.call_later(timeout_s / 4, watch)

    async def send(text: str, seq: int | None = None) -> None:
        nonlocal last_sent, sending_since
        sending_since = loop.time()
        try:
            await ws.send_text(text)
        finally:
            sending_since = 0.0
        if seq is not None:
            last_sent = seq
        if slow:  # it went out after all: the client read again, within one more timeout
            watchdog.cancel()
            raise _ClientTooSlowError

    names = service.class_names
    encoder: ResultEventEncoder = ws.app.state.encoder
    watchdog = loop.call_later(timeout_s / 4, watch)
    try:
        replay = sub.replay
        if replay.gap and after is not None:
            await send(
                GapEvent(requested_after=after, oldest_seq=replay.oldest_seq).model_dump_json()
            )
        for start in range(0, len(replay.results), _REPLAY_CHUNK):
            chunk = replay.results[start : start + _REPLAY_CHUNK]
            # A replay can be thousands of results: encoded off the event loop, in chunks.
            texts = await loop.run_in_executor(_REPLAY_ENCODERS, encoder.encode_many, chunk, names)
            for result, text in zip(chunk, texts, strict=True):
                await send(text, result.seq)
            await asyncio.sleep(0)  # a chunk at a time: other clients and requests go between
        while True:
            result = await sub.get()
            await send(encoder.encode(result, names), result.seq)
    except _ClientTooSlowError:
        sub.close()
        await _goodbye(ws, "lagging", last_sent, status.WS_1013_TRY_AGAIN_LATER, timeout_s)
    except SubscriptionEndedError as end:
        kind, code = _END[end.reason]
        await _goodbye(ws, kind, last_sent, code, timeout_s)
    finally:
        watchdog.cancel()


async def _goodbye(
    ws: WebSocket, kind: EndKind, resume_after: int, code: int, timeout_s: float
) -> None:
    """The last message and the close, each bounded: a client that reads nothing any more
    must not hold its connection open (returning drops it)."""
    try:
        async with asyncio.timeout(timeout_s):
            await ws.send_text(EndEvent(type=kind, resume_after=resume_after).model_dump_json())
        async with asyncio.timeout(timeout_s):
            await ws.close(code)
    except TimeoutError:
        pass
