"""Event clips of a fleet (settings `cluster`; docs/fleet.md), through any node.

A clip stays on the disk of the node that ran its stream when it was recorded, and a stream
moves between nodes, so its clips may lie on several. A listing asks every live node for its
clips of the stream and merges them (each named with its node); a clip another node keeps is
streamed from it in parts over NATS request/reply, each a byte range that fits a NATS message,
so that a client's range requests (a browser seeking) cost only the bytes asked for; a delete
goes to the node that keeps the clip. What another node answers is checked before anyone sees
it: a listing against the API's schema, each part against the range asked for.

Everything here runs on the event loop; the clips folder is read in the thread pool.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from vdet.api.fleet_reads import ASK_TIMEOUT_S
from vdet.api.schemas_clips import ClipsOut, clips_out
from vdet.clips.store import MEDIA_TYPE, ClipStore, clip_path
from vdet.config.streams import STREAM_ID_PATTERN

if TYPE_CHECKING:
    from vdet.fleet.member import Answer, FleetMember
    from vdet.root import Service

# The reads other nodes answer here (vdet.api.app routes them).
OPS = frozenset({"clips", "clip", "clip_delete"})
# The most bytes of a clip one answer carries; less where the servers' max_payload is smaller.
MAX_PART_BYTES = 512 << 10
_HEAD_ROOM = 4 << 10  # the answer's JSON head
_STREAM_ID_RE = re.compile(STREAM_ID_PATTERN)
_VIDEO_NAME_RE = re.compile(r"^[0-9]{13}(-[0-9]{1,3})?\.(mp4|mkv)$")  # vdet.clips.store's


class ClipPartError(Exception):
    """A part of a clip another node keeps could not be had (it went, or its node did)."""


@dataclasses.dataclass(frozen=True)
class RemoteClip:
    """A clip on another node's disk, as that node described it."""

    node: str
    stream_id: str
    clip_id: str
    size: int
    media_type: str
    name: str


def _fleet(service: Service) -> FleetMember:
    if service.fleet is None:
        raise RuntimeError("not a fleet node")
    return service.fleet


def _others(fleet: FleetMember) -> list[str]:
    me = fleet.node.node_id
    return sorted(n for n in fleet.node.view.live_nodes(fleet.store.node_ttl_s) if n != me)


def part_bytes(service: Service) -> int:
    """The size of the parts a clip is asked for in."""
    max_payload = _fleet(service).store.client.max_payload
    return max(1, min(MAX_PART_BYTES, max_payload - _HEAD_ROOM))


# -- the asking node ---------------------------------------------------------------------


async def list_clips(service: Service, store: ClipStore | None, stream_id: str) -> ClipsOut | None:
    """The stream's clips on every live node, oldest first; None when no node has clips on
    (`clips.folder`). Raises nothing for a node that does not answer: it is named in
    `unanswered`."""
    fleet = _fleet(service)
    me = fleet.node.node_id
    others = _others(fleet)
    asked = asyncio.gather(
        *(fleet.ask(node, "clips", {"id": stream_id}, ASK_TIMEOUT_S) for node in others)
    )
    local = None
    if store is not None:
        local = await run_in_threadpool(clips_out, store, stream_id, service.metrics, me)
    listings: list[ClipsOut] = [] if local is None else [local]
    unanswered: list[str] = []
    for node, answer in zip(others, await asked, strict=True):
        if answer.status == 404:  # clips are off there
            continue
        try:
            if answer.error is not None:
                raise ValueError(answer.error)
            theirs = ClipsOut.model_validate(answer.head.get("clips"))
        except (ValueError, ValidationError):
            unanswered.append(node)
            continue
        listings.append(
            theirs.model_copy(
                update={
                    "clips": [
                        c.model_copy(update={"node": node, "url": clip_path(stream_id, c.clip_id)})
                        for c in theirs.clips
                        if c.source_id == stream_id
                    ]
                }
            )
        )
    if not listings and not unanswered:
        return None
    seen: set[str] = set()  # a folder several nodes share lists its clips once
    clips = []
    for listing in listings:
        for clip in listing.clips:
            if clip.clip_id not in seen:
                seen.add(clip.clip_id)
                clips.append(clip)
    failed: dict[str, int] = {}
    for listing in listings:
        for reason, count in listing.failed.items():
            failed[reason] = failed.get(reason, 0) + count
    return ClipsOut(
        clips=sorted(clips, key=lambda c: c.start_time),
        kept_clips=sum(listing.kept_clips for listing in listings),
        kept_bytes=sum(listing.kept_bytes for listing in listings),
        failed=failed,
        unanswered=unanswered,
    )


async def locate(service: Service, stream_id: str, clip_id: str) -> RemoteClip | None:
    """The clip on another live node's disk; None when no node that answers keeps it."""
    fleet = _fleet(service)
    others = _others(fleet)
    args = {"id": stream_id, "clip_id": clip_id, "offset": 0, "length": 0}
    answers = await asyncio.gather(
        *(fleet.ask(node, "clip", args, ASK_TIMEOUT_S) for node in others)
    )
    for node, answer in zip(others, answers, strict=True):
        found = _described(node, stream_id, clip_id, answer)
        if found is not None:
            return found
    return None


def _described(node: str, stream_id: str, clip_id: str, answer: Answer) -> RemoteClip | None:
    if answer.error is not None:
        return None
    head = answer.head
    size, media_type, name = head.get("size"), head.get("media_type"), head.get("name")
    if not isinstance(size, int) or size < 0 or media_type not in MEDIA_TYPE.values():
        return None
    if not isinstance(name, str) or not _VIDEO_NAME_RE.match(name):
        return None
    return RemoteClip(node, stream_id, clip_id, size, str(media_type), name)


async def read(service: Service, clip: RemoteClip, offset: int, length: int) -> bytes:
    """Bytes [offset, offset + length) of `clip`, at most `part_bytes`; ClipPartError when
    its node does not give exactly them."""
    fleet = _fleet(service)
    args = {"id": clip.stream_id, "clip_id": clip.clip_id, "offset": offset, "length": length}
    answer = await fleet.ask(clip.node, "clip", args, ASK_TIMEOUT_S)
    if answer.error is not None:
        raise ClipPartError(answer.error)
    if answer.head.get("size") != clip.size:
        raise ClipPartError(f"clip {clip.clip_id} changed on node {clip.node}")
    if len(answer.body) != min(length, clip.size - offset):
        raise ClipPartError(f"node {clip.node} answered {len(answer.body)} bytes, not {length}")
    return answer.body


async def delete(service: Service, stream_id: str, clip_id: str) -> bool:
    """Delete the clip wherever another live node keeps it; whether any did."""
    fleet = _fleet(service)
    others = _others(fleet)
    args = {"id": stream_id, "clip_id": clip_id}
    answers = await asyncio.gather(
        *(fleet.ask(node, "clip_delete", args, ASK_TIMEOUT_S) for node in others)
    )
    return any(a.error is None and a.head.get("deleted") is True for a in answers)


# -- the node that keeps the clips -------------------------------------------------------


async def answer(service: Service, op: str, args: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    """This node's answer to another node's clip read (`OPS`), from its own clips folder,
    whether or not the stream runs here now."""
    store = ClipStore.of(service.settings.clips)
    if store is None:
        return {"error": "clips are off (clips.folder)", "status": 404}, b""
    stream_id = args.get("id")
    if not isinstance(stream_id, str) or not _STREAM_ID_RE.match(stream_id):
        return {"error": "bad clip request", "status": 400}, b""
    node = service.fleet.node.node_id if service.fleet is not None else None
    if op == "clips":
        listing = await run_in_threadpool(clips_out, store, stream_id, service.metrics, node)
        return {"clips": listing.model_dump(mode="json")}, b""
    clip_id = args.get("clip_id")
    if not isinstance(clip_id, str):
        return {"error": "bad clip request", "status": 400}, b""
    if op == "clip_delete":
        deleted = await run_in_threadpool(store.delete, stream_id, clip_id)
        return {"deleted": deleted}, b""
    offset, length = args.get("offset"), args.get("length")
    if not isinstance(offset, int) or not isinstance(length, int):
        return {"error": "bad clip request", "status": 400}, b""
    if offset < 0 or not 0 <= length <= MAX_PART_BYTES:
        return {"error": "bad clip range", "status": 400}, b""
    found = await run_in_threadpool(_read_part, store, stream_id, clip_id, offset, length)
    if found is None:
        return {"error": f"no clip {clip_id!r}", "status": 404}, b""
    path, size, data = found
    head = {"size": size, "media_type": MEDIA_TYPE.get(path.suffix, "video/mp4"), "name": path.name}
    return head, data


def _read_part(
    store: ClipStore, stream_id: str, clip_id: str, offset: int, length: int
) -> tuple[Path, int, bytes] | None:
    found = store.get(stream_id, clip_id)
    if found is None:
        return None
    _, path = found
    try:
        with path.open("rb") as video:
            size = video.seek(0, 2)
            video.seek(min(offset, size))
            return path, size, video.read(length)
    except OSError:  # deleted meanwhile
        return None
