"""Reads of the fleet's streams on any node (settings `cluster`; docs/fleet.md).

A stream this node runs is read here, as on one node. A stream another node holds the lease of
is asked of that node over NATS (request/reply, bounded in size and time,
`FleetMember.ask`), which answers with what its own API would show (`answer`); what comes back
is another node's message and is validated against the API's schema before anyone sees it. A
desired stream no node runs, or whose owner does not answer within the bound, is shown from
its spec with the reason in `status.last_error`, so a read never hangs on a dead node.

Everything here runs on the event loop (the fleet's view lives there); the local stream
service's calls, which may block, go to the thread pool.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from vdet.api.deps import not_ready
from vdet.api.schemas import StreamOut
from vdet.api.schemas_tracking import CountsOut
from vdet.api.views import stream_out
from vdet.config.streams import StreamSpec
from vdet.core.types import SourceState, SourceStatus
from vdet.streams.service import (
    EncodedFrame,
    PictureRequest,
    StreamService,
    StreamUnavailableError,
    UnknownStreamError,
    view_of_spec,
)

if TYPE_CHECKING:
    from vdet.fleet.member import FleetMember
    from vdet.root import Service

log = logging.getLogger(__name__)

# How long a read waits for another node (a dead node's streams answer after this).
ASK_TIMEOUT_S = 3.0


def _parts(service: Service) -> tuple[FleetMember, StreamService]:
    fleet, streams = service.fleet, service.streams
    if fleet is None or streams is None or not service.ready:
        raise not_ready()
    return fleet, streams


def _names(service: Service) -> tuple[str, ...]:
    return service.class_names


def _unrun(service: Service, spec: StreamSpec, why: str) -> StreamOut:
    status = SourceStatus(state=SourceState.CONNECTING, last_error=why)
    view = view_of_spec(spec, service.settings.detection, _names(service), status)
    return stream_out(view, _names(service))


def _why_unrun(owner: str | None, error: str | None) -> str:
    if owner is None:
        return "no node runs it now: waiting for a node with room, or for a lease to expire"
    return f"{error}; it moves to another node when its lease expires"


def _validated(out: Any, owner: str) -> StreamOut | None:
    try:
        return StreamOut.model_validate(out).model_copy(update={"node": owner})
    except ValidationError:
        log.warning("fleet: node %s answered a stream that is not one", owner)
        return None


async def list_streams(service: Service) -> list[StreamOut]:
    """Every desired stream of the fleet, sorted by id."""
    fleet, streams = _parts(service)
    me = fleet.node.node_id
    local = {
        v.spec.id: stream_out(v, _names(service), me) for v in await run_in_threadpool(streams.list)
    }
    view = fleet.node.view
    owners = {s: view.owner(s) for s in view.desired if s not in local}
    asked = sorted({o for o in owners.values() if o is not None and o != me})
    answers = await asyncio.gather(
        *(fleet.ask(node, "streams", {}, ASK_TIMEOUT_S) for node in asked)
    )
    found: dict[str, StreamOut] = {}
    errors: dict[str, str | None] = {}
    for node, answer in zip(asked, answers, strict=True):
        errors[node] = answer.error
        items = answer.head.get("streams") if answer.error is None else None
        for item in items if isinstance(items, list) else []:
            out = _validated(item, node)
            if out is not None and owners.get(out.id) == node:
                found[out.id] = out
    result = dict(local)
    for stream_id, owner in owners.items():
        if stream_id in found:
            result[stream_id] = found[stream_id]
        elif (spec := fleet.spec(stream_id)) is not None:
            error = errors.get(owner or "") or f"node {owner} does not list it"
            result[stream_id] = _unrun(service, spec, _why_unrun(owner, error))
    return [result[k] for k in sorted(result)]


async def get_stream(service: Service, stream_id: str) -> StreamOut:
    fleet, streams = _parts(service)
    me = fleet.node.node_id
    if stream_id in streams:
        with_local = await run_in_threadpool(streams.get, stream_id)
        return stream_out(with_local, _names(service), me)
    spec = fleet.spec(stream_id)
    if spec is None:
        raise UnknownStreamError(f"no stream {stream_id!r}")
    owner = fleet.node.view.owner(stream_id)
    error = None
    if owner is not None and owner != me:
        answer = await fleet.ask(owner, "stream", {"id": stream_id}, ASK_TIMEOUT_S)
        if answer.error is None and (out := _validated(answer.head.get("stream"), owner)):
            return out
        error = answer.error or f"node {owner} answered no stream"
    return _unrun(service, spec, _why_unrun(owner, error))


async def picture(service: Service, stream_id: str, request: PictureRequest) -> EncodedFrame | None:
    """A stream's latest frame as JPEG from the node that runs it; None before its first."""
    fleet, streams = _parts(service)
    if stream_id in streams:
        return await run_in_threadpool(streams.picture, stream_id, request)
    if fleet.spec(stream_id) is None:
        raise UnknownStreamError(f"no stream {stream_id!r}")
    owner = fleet.node.view.owner(stream_id)
    if owner is None or owner == fleet.node.node_id:
        return None
    args = {
        "id": stream_id,
        "boxes": request.boxes,
        "quality": request.quality,
        "max_width": request.max_width,
    }
    answer = await fleet.ask(owner, "picture", args, ASK_TIMEOUT_S)
    if answer.error is not None or answer.status == 204 or not answer.body:
        return None
    head = answer.head
    try:
        return EncodedFrame(
            seq=int(head["seq"]),
            jpeg=answer.body if answer.body.startswith(b"\xff\xd8") else b"",
            width=int(head["width"]),
            height=int(head["height"]),
            source_width=int(head["source_width"]),
            source_height=int(head["source_height"]),
        )
    except (KeyError, TypeError, ValueError):
        return None


async def counts(service: Service, stream_id: str) -> CountsOut:
    """A stream's zone counts from the node that runs it (its metrics have them)."""
    fleet, streams = _parts(service)
    if stream_id in streams:
        found = service.metrics.zone_counts(stream_id)
        return CountsOut(objects=found.objects, crossings=found.crossings)
    if fleet.spec(stream_id) is None:
        raise UnknownStreamError(f"no stream {stream_id!r}")
    owner = fleet.node.view.owner(stream_id)
    if owner is None or owner == fleet.node.node_id:
        raise StreamUnavailableError(f"no node runs stream {stream_id!r} now; retry shortly")
    answer = await fleet.ask(owner, "counts", {"id": stream_id}, ASK_TIMEOUT_S)
    if answer.error is None:
        try:
            return CountsOut.model_validate(answer.head.get("counts"))
        except ValidationError:
            raise StreamUnavailableError(f"node {owner} answered what are not counts") from None
    raise StreamUnavailableError(answer.error)


async def answer(service: Service, op: str, args: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    """This node's answer to another node's read (`FleetMember.serve_reads`)."""
    streams = service.streams
    if streams is None or not service.ready:
        return {"error": "the node is starting or stopping", "status": 503}, b""
    names = _names(service)
    me = service.fleet.node.node_id if service.fleet is not None else None
    if op == "streams":
        views = await run_in_threadpool(streams.list)
        return {"streams": [stream_out(v, names, me).model_dump(mode="json") for v in views]}, b""
    stream_id = args.get("id")
    if not isinstance(stream_id, str) or stream_id not in streams:
        return {"error": f"no stream {stream_id!r} on this node", "status": 404}, b""
    if op == "stream":
        view = await run_in_threadpool(streams.get, stream_id)
        return {"stream": stream_out(view, names, me).model_dump(mode="json")}, b""
    if op == "counts":
        found = service.metrics.zone_counts(stream_id)
        out = CountsOut(objects=found.objects, crossings=found.crossings)
        return {"counts": out.model_dump(mode="json")}, b""
    if op == "picture":
        try:
            request = PictureRequest(
                boxes=bool(args.get("boxes", True)),
                quality=min(95, max(10, int(args.get("quality", 85)))),
                max_width=None if args.get("max_width") is None else int(args["max_width"]),
            )
        except (TypeError, ValueError):
            return {"error": "bad picture request", "status": 400}, b""
        frame = await run_in_threadpool(streams.picture, stream_id, request)
        if frame is None:
            return {"status": 204}, b""
        head = {
            "seq": frame.seq,
            "width": frame.width,
            "height": frame.height,
            "source_width": frame.source_width,
            "source_height": frame.source_height,
        }
        return head, frame.jpeg
    return {"error": f"unknown read {op!r}", "status": 400}, b""
