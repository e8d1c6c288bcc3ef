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

from fastapi import HTTPException
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from vdet.api.deps import not_ready
from vdet.api.schemas import StreamOut
from vdet.api.schemas_snapshots import EventSnapshotsOut, event_snapshots_out
from vdet.api.schemas_tracking import CountsOut
from vdet.api.schemas_workers import WorkersOut, workers_out
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
    from vdet.fleet.member import Answer, FleetMember
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


async def _owner_answer(
    service: Service, stream_id: str, op: str, args: dict[str, Any] | None = None
) -> Answer | None:
    """What the node that runs `stream_id` answers to `op`; None when no other node runs it
    now. UnknownStreamError when the fleet has no such stream."""
    fleet, _ = _parts(service)
    if fleet.spec(stream_id) is None:
        raise UnknownStreamError(f"no stream {stream_id!r}")
    owner = fleet.node.view.owner(stream_id)
    if owner is None or owner == fleet.node.node_id:
        return None
    return await fleet.ask(owner, op, {**(args or {}), "id": stream_id}, ASK_TIMEOUT_S)


def _refused(answer: Answer) -> Exception:
    """The API's error for an owner's refusal: its 404 as a 404 (no such snapshot), anything
    else (gone, moving, starting) as 503, to retry."""
    if answer.status == 404:
        return HTTPException(404, answer.error or "not found")
    return StreamUnavailableError(answer.error or "the node running the stream did not answer")


def _unrun_error(stream_id: str) -> StreamUnavailableError:
    return StreamUnavailableError(f"no node runs stream {stream_id!r} now; retry shortly")


def _picture_args(request: PictureRequest) -> dict[str, Any]:
    return {
        "boxes": request.boxes,
        "quality": request.quality,
        "max_width": request.max_width,
        "newest": request.newest,
        "unless": None if request.unless is None else list(request.unless),
    }


def _picture_request(args: dict[str, Any]) -> PictureRequest:
    """The PictureRequest another node sent; ValueError or TypeError when it is not one."""
    unless = args.get("unless")
    if unless is not None:
        frame, result = unless
        unless = (int(frame), None if result is None else int(result))
    max_width = args.get("max_width")
    return PictureRequest(
        boxes=bool(args.get("boxes", True)),
        quality=min(95, max(10, int(args.get("quality", 85)))),
        max_width=None if max_width is None else min(7680, max(16, int(max_width))),
        newest=bool(args.get("newest", False)),
        unless=unless,
    )


async def picture(service: Service, stream_id: str, request: PictureRequest) -> EncodedFrame | None:
    """A stream's latest frame as JPEG from the node that runs it; None before its first,
    while no node runs it, or when its owner does not answer."""
    _, streams = _parts(service)
    if stream_id in streams:
        return await run_in_threadpool(streams.picture, stream_id, request)
    answer = await _owner_answer(service, stream_id, "picture", _picture_args(request))
    if answer is None or answer.error is not None or answer.status == 204 or not answer.body:
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
            frame_index=int(head.get("frame_index", 0)),
            result_frame_index=int(head.get("result_frame_index", 0)),
            boxes_drawn=bool(head.get("boxes_drawn", False)),
        )
    except (KeyError, TypeError, ValueError):
        return None


class OwnerPictures:
    """The live view's pictures (vdet.api.live.Pictures) of streams other nodes run: each
    asked of the stream's owner when the viewer's next frame is due, from the live view's
    encoder threads, which wait here for the event loop. The live view's sharing and pacing
    apply as to a stream of this node: one request per new picture and key, at most
    `live.max_fps` a second."""

    def __init__(self, service: Service, loop: asyncio.AbstractEventLoop) -> None:
        self._service = service
        self._loop = loop

    def picture(self, stream_id: str, request: PictureRequest) -> EncodedFrame | None:
        asked = asyncio.run_coroutine_threadsafe(
            picture(self._service, stream_id, request), self._loop
        )
        return asked.result(ASK_TIMEOUT_S + 5.0)


async def event_snapshots(service: Service, stream_id: str) -> EventSnapshotsOut:
    """A stream's event snapshots, listed by the node that runs it."""
    answer = await _owner_answer(service, stream_id, "snapshots")
    if answer is None:
        raise _unrun_error(stream_id)
    if answer.error is not None:
        raise _refused(answer)
    try:
        return EventSnapshotsOut.model_validate(answer.head.get("snapshots"))
    except ValidationError:
        raise StreamUnavailableError("the node running the stream answered no listing") from None


async def event_snapshot(service: Service, stream_id: str, frame_index: int) -> bytes | None:
    """The JPEG of one event snapshot from the node that runs the stream; None when it has
    none of that frame."""
    answer = await _owner_answer(service, stream_id, "snapshot", {"frame_index": frame_index})
    if answer is None:
        raise _unrun_error(stream_id)
    if answer.status == 404:
        return None
    if answer.error is not None:
        raise _refused(answer)
    return answer.body if answer.body.startswith(b"\xff\xd8") else None


async def counts(service: Service, stream_id: str) -> CountsOut:
    """A stream's zone counts from the node that runs it (its metrics have them)."""
    _, streams = _parts(service)
    if stream_id in streams:
        found = service.metrics.zone_counts(stream_id)
        return CountsOut(objects=found.objects, crossings=found.crossings)
    answer = await _owner_answer(service, stream_id, "counts")
    if answer is None:
        raise _unrun_error(stream_id)
    if answer.error is not None:
        raise _refused(answer)
    try:
        return CountsOut.model_validate(answer.head.get("counts"))
    except ValidationError:
        raise StreamUnavailableError("the node running the stream answered no counts") from None


async def workers(service: Service) -> WorkersOut:
    """Every live node's worker processes, each named with its node; the nodes that did not
    answer in time are named in `unanswered`."""
    fleet, _ = _parts(service)
    me = fleet.node.node_id
    live = fleet.node.view.live_nodes(fleet.store.node_ttl_s)
    others = sorted(n for n in live if n != me)
    answers = await asyncio.gather(
        *(fleet.ask(node, "workers", {}, ASK_TIMEOUT_S) for node in others)
    )
    here = await run_in_threadpool(workers_out, service.worker_pool, me)
    found, unanswered = list(here.workers), []
    for node, answer in zip(others, answers, strict=True):
        try:
            if answer.error is not None:
                raise ValueError(answer.error)
            theirs = WorkersOut.model_validate(answer.head.get("workers"))
        except (ValueError, ValidationError):
            unanswered.append(node)
            continue
        found += [w.model_copy(update={"node": node}) for w in theirs.workers]
    return WorkersOut(mps=here.mps, workers=found, unanswered=unanswered)


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
    if op == "workers":
        mine = await run_in_threadpool(workers_out, service.worker_pool)
        return {"workers": mine.model_dump(mode="json")}, b""
    stream_id = args.get("id")
    if not isinstance(stream_id, str) or stream_id not in streams:
        # Moving between nodes, most likely: the asking node answers 503, to retry.
        return {"error": f"stream {stream_id!r} does not run on node {me}", "status": 503}, b""
    if op == "stream":
        view = await run_in_threadpool(streams.get, stream_id)
        return {"stream": stream_out(view, names, me).model_dump(mode="json")}, b""
    if op == "counts":
        found = service.metrics.zone_counts(stream_id)
        out = CountsOut(objects=found.objects, crossings=found.crossings)
        return {"counts": out.model_dump(mode="json")}, b""
    if op == "snapshots":
        kept = await run_in_threadpool(streams.event_snapshots, stream_id)
        listing = event_snapshots_out(stream_id, kept, names)
        return {"snapshots": listing.model_dump(mode="json")}, b""
    if op == "snapshot":
        frame_index = args.get("frame_index")
        if not isinstance(frame_index, int) or frame_index < 0:
            return {"error": "bad snapshot request", "status": 400}, b""
        snapshot = await run_in_threadpool(streams.event_snapshot, stream_id, frame_index)
        if snapshot is None:
            return {"error": f"no snapshot of frame {frame_index}", "status": 404}, b""
        return {"frame_index": frame_index}, snapshot.jpeg
    if op == "picture":
        try:
            request = _picture_request(args)
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
            "frame_index": frame.frame_index,
            "result_frame_index": frame.result_frame_index,
            "boxes_drawn": frame.boxes_drawn,
        }
        return head, frame.jpeg
    return {"error": f"unknown read {op!r}", "status": 400}, b""
