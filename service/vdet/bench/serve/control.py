"""The REST side of the benchmark: streams added and removed, and control calls timed under load.

Streams are paced, looping file streams added with `POST /v1/streams` as a user adds cameras
(or, unpaced, files analysed frame by frame as fast as the server detects).
While a step is measured, a control loop makes the calls an operator or an orchestrator makes
on a loaded server and times each round trip at the client: `GET /v1/streams/{id}/detections`
of a measured stream every tick, and every fourth tick a `POST` of one extra stream or the
`DELETE` of it (so the server runs N or N + 1 streams). Errors are counted by status, never
raised: a benchmark of an overloaded server must finish and say what failed.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

_ADD_CONCURRENCY = 8
_MUTATE_EVERY = 4


def stream_spec(stream_id: str, clip: str, realtime: bool = True) -> dict[str, Any]:
    """A looping file stream paced at the clip's frame rate, like a camera; not `realtime`:
    analysed frame by frame as fast as detection goes."""
    return {"id": stream_id, "url": clip, "loop": True, "realtime": realtime}


@dataclass
class CallLog:
    """Round-trip seconds per call kind, and failures by kind and status."""

    seconds: dict[str, list[float]] = field(default_factory=dict)
    errors: Counter[str] = field(default_factory=Counter)

    async def call(
        self, kind: str, http: httpx.AsyncClient, method: str, url: str, **kwargs: Any
    ) -> httpx.Response | None:
        started = time.perf_counter()
        try:
            response = await http.request(method, url, **kwargs)
        except httpx.HTTPError as exc:
            self.errors[f"{kind} {type(exc).__name__}"] += 1
            return None
        self.seconds.setdefault(kind, []).append(time.perf_counter() - started)
        if response.status_code >= 400:
            self.errors[f"{kind} HTTP {response.status_code}"] += 1
        return response


async def add_streams(
    http: httpx.AsyncClient, ids: Sequence[str], clip: str, log: CallLog, realtime: bool = True
) -> int:
    """POST every stream, a few at a time; how many were added."""
    gate = asyncio.Semaphore(_ADD_CONCURRENCY)

    async def add(stream_id: str) -> bool:
        async with gate:
            spec = stream_spec(stream_id, clip, realtime)
            response = await log.call("add", http, "POST", "/v1/streams", json=spec)
        return response is not None and response.status_code == 201

    return sum(await asyncio.gather(*(add(i) for i in ids)))


async def remove_streams(http: httpx.AsyncClient, ids: Sequence[str], log: CallLog) -> None:
    gate = asyncio.Semaphore(_ADD_CONCURRENCY)

    async def remove(stream_id: str) -> None:
        async with gate:
            await log.call("remove", http, "DELETE", f"/v1/streams/{stream_id}")

    await asyncio.gather(*(remove(i) for i in ids))


async def processed_counts(http: httpx.AsyncClient) -> dict[str, int]:
    """Frames processed so far per stream id, from GET /v1/streams."""
    response = await http.get("/v1/streams")
    response.raise_for_status()
    return {s["id"]: int(s["status"]["frames_processed"]) for s in response.json()["streams"]}


async def workers_of(http: httpx.AsyncClient) -> dict[str, str | None]:
    """The worker process running each stream, from GET /v1/streams (None: in-process); empty
    when the call fails."""
    try:
        response = await http.get("/v1/streams")
        response.raise_for_status()
    except httpx.HTTPError:
        return {}
    return {s["id"]: s.get("worker") for s in response.json()["streams"]}


async def decode_paths(http: httpx.AsyncClient, ids: Sequence[str]) -> dict[str, int]:
    """How many of the streams in `ids` decode on each path ("nvdec", "cpu", "unknown"), from
    GET /v1/streams; empty when the call fails."""
    try:
        response = await http.get("/v1/streams")
        response.raise_for_status()
    except httpx.HTTPError:
        return {}
    wanted = set(ids)
    counts: dict[str, int] = {}
    for stream in response.json()["streams"]:
        if stream["id"] in wanted:
            path = stream["status"].get("decode_path") or "unknown"
            counts[path] = counts.get(path, 0) + 1
    return counts


async def worker_pids(http: httpx.AsyncClient) -> dict[int, str]:
    """Each worker process's pid -> its name (w0, spare0, ...), from GET /v1/workers; empty
    when the call fails or streams run in the API process."""
    try:
        response = await http.get("/v1/workers")
        response.raise_for_status()
    except httpx.HTTPError:
        return {}
    return {
        w["pid"]: f"{w['role']} {w['name']}" for w in response.json()["workers"] if w.get("pid")
    }


async def wait_publishing(http: httpx.AsyncClient, ids: Sequence[str], timeout_s: float) -> bool:
    """Whether every stream in `ids` processed a frame within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            counts = await processed_counts(http)
        except httpx.HTTPError:
            counts = {}
        if all(counts.get(i, 0) > 0 for i in ids):
            return True
        await asyncio.sleep(0.25)
    return False


async def control_loop(
    http: httpx.AsyncClient,
    measured: Sequence[str],
    extra_prefix: str,
    clip: str,
    interval_s: float,
    until: float,
    seed: int = 0,
    mutate: bool = True,
) -> CallLog:
    """Timed control calls until the wall-clock time `until`; the extra stream is removed at
    the end. Ticks are spaced `interval_s` from the start of each call, so a slow call delays
    the next one rather than piling calls up. Without `mutate` only the GETs: no extra stream
    takes detection away from the measured ones (a throughput run)."""
    log = CallLog()
    rng = random.Random(seed)
    extra: str | None = None
    counter = itertools.count()
    for tick in itertools.count():
        started = time.time()
        if started >= until:
            break
        await log.call(
            "get_detections", http, "GET", f"/v1/streams/{rng.choice(measured)}/detections"
        )
        if mutate and tick % _MUTATE_EVERY == _MUTATE_EVERY - 1:
            if extra is None:
                candidate = f"{extra_prefix}{next(counter)}"
                response = await log.call(
                    "post", http, "POST", "/v1/streams", json=stream_spec(candidate, clip)
                )
                if response is not None and response.status_code == 201:
                    extra = candidate
            else:
                await log.call("delete", http, "DELETE", f"/v1/streams/{extra}")
                extra = None
        await asyncio.sleep(max(0.0, min(until, started + interval_s) - time.time()))
    if extra is not None:
        await log.call("cleanup", http, "DELETE", f"/v1/streams/{extra}")
    return log
