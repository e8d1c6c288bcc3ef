"""One worker process of the server under test killed with SIGKILL mid-window, and its cost.

The target measured: kill -9 one worker under load; the other workers' streams drop nothing
and the killed worker's streams publish again within seconds. This module picks the worker
(`GET /v1/workers`: role `worker`, alive, running the most of the step's streams; ties by
name), checks that its pid is in the server's process tree (the benchmark kills only what it
started), kills it, tells the WebSocket clients when, and polls `GET /v1/streams` until every
stream it ran has shown `failed`. `summarize` then turns the clients' per-stream figures and
the server's per-stream counters into the step's `WorkerKill`. It sequences nothing else:
the runner decides when a step kills.
"""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from vdet.bench.serve.results import ClientFigures, WorkerKill
from vdet.bench.serve.scrape import StreamCounters

FAILED_POLL_S = 0.05


@dataclass(frozen=True)
class KillRecord:
    """What was killed and when (wall clock), or why nothing was."""

    worker: str | None = None
    pid: int | None = None
    killed_at: float | None = None
    killed_streams: tuple[str, ...] = ()
    failed_after_s: Mapping[str, float] = field(default_factory=dict)  # per stream, from kill
    error: str | None = None


def _streams_by_worker(
    streams: Sequence[Mapping[str, Any]], ids: Sequence[str]
) -> dict[str, list[str]]:
    measured = set(ids)
    out: dict[str, list[str]] = {}
    for stream in streams:
        if stream.get("id") in measured and stream.get("worker"):
            out.setdefault(str(stream["worker"]), []).append(str(stream["id"]))
    return out


def pick_worker(
    workers: Sequence[Mapping[str, Any]], streams: Sequence[Mapping[str, Any]], ids: Sequence[str]
) -> tuple[Mapping[str, Any], list[str]] | str:
    """The worker to kill and its measured streams, or why there is none."""
    if not workers:
        return "the server runs no worker processes (GET /v1/workers is empty): nothing killed"
    on = _streams_by_worker(streams, ids)
    candidates = [
        w
        for w in workers
        if w.get("role") == "worker" and w.get("alive") and w.get("pid") and on.get(w["name"])
    ]
    if not candidates:
        return "no live worker runs a stream of this step: nothing killed"
    victim = min(candidates, key=lambda w: (-len(on[w["name"]]), str(w["name"])))
    return victim, sorted(on[victim["name"]])


async def _watch_failed(
    http: httpx.AsyncClient, killed: Sequence[str], killed_at: float, until: float
) -> dict[str, float]:
    """Seconds from the kill until GET /v1/streams first showed each stream `failed`."""
    seen: dict[str, float] = {}
    while len(seen) < len(killed) and time.time() < until:
        try:
            response = await http.get("/v1/streams")
            response.raise_for_status()
            states = {s["id"]: s["status"]["state"] for s in response.json()["streams"]}
        except (httpx.HTTPError, ValueError, KeyError):
            states = {}
        now = time.time()
        for stream_id in killed:
            if stream_id not in seen and states.get(stream_id) == "failed":
                seen[stream_id] = round(now - killed_at, 3)
        await asyncio.sleep(FAILED_POLL_S)
    return seen


async def kill_one_worker(
    http: httpx.AsyncClient,
    ids: Sequence[str],
    at: float,
    until: float,
    server_tree: Callable[[], Sequence[int]],
    notify: Callable[[float], None],
) -> KillRecord:
    """At wall-clock time `at`, SIGKILL the worker running most of `ids`; `notify(killed_at)`;
    watch its streams fail until `until`. Errors are recorded, never raised."""
    await asyncio.sleep(max(0.0, at - time.time()))
    try:
        workers_response = await http.get("/v1/workers")
        workers_response.raise_for_status()
        streams_response = await http.get("/v1/streams")
        streams_response.raise_for_status()
        picked = pick_worker(
            workers_response.json()["workers"], streams_response.json()["streams"], ids
        )
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        return KillRecord(error=f"could not list the workers: {type(exc).__name__}: {exc}")
    if isinstance(picked, str):
        return KillRecord(error=picked)
    victim, killed = picked
    name, pid = str(victim["name"]), int(victim["pid"])
    if pid not in await asyncio.to_thread(server_tree):
        return KillRecord(
            worker=name, pid=pid, error=f"pid {pid} of {name} is not in the server's tree"
        )
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return KillRecord(worker=name, pid=pid, error=f"{name} (pid {pid}) had exited")
    killed_at = time.time()
    notify(killed_at)
    failed = await _watch_failed(http, killed, killed_at, until)
    return KillRecord(name, pid, killed_at, tuple(killed), failed)


def summarize(
    record: KillRecord,
    ids: Sequence[str],
    window: tuple[float, float],
    clients: Sequence[ClientFigures],
    per_stream: Sequence[Mapping[str, Mapping[str, Any]]],
    counters: tuple[Mapping[str, StreamCounters], Mapping[str, StreamCounters]] | None,
) -> WorkerKill:
    """The step's WorkerKill from the kill, each client's per-stream figures (as the client
    sent them) and /metrics per stream at the window's start and end."""
    start, end = window
    killed = set(record.killed_streams)
    others = [i for i in ids if i not in killed]
    dropped: dict[str, float] = {}
    if counters is not None:
        before, after = counters
        for stream_id in ids:
            if stream_id in before and stream_id in after:
                dropped[stream_id] = after[stream_id].dropped - before[stream_id].dropped
    base = WorkerKill(
        worker=record.worker,
        pid=record.pid,
        t_s=round(record.killed_at - start, 3) if record.killed_at is not None else None,
        killed_streams=sorted(killed),
        other_streams=len(others),
        others_missing=None,
        others_max_gap_ms=None,
        others_server_dropped=sum(dropped.get(i, 0.0) for i in others) if counters else None,
        killed_server_dropped=sum(dropped.get(i, 0.0) for i in killed) if counters else None,
        server_dropped_per_stream={k: v for k, v in sorted(dropped.items()) if v},
        failed_after_s=None,
        failed_seen=len(record.failed_after_s),
        republished=0,
        republished_s_max=None,
        republished_s_median=None,
        clients_connected=True,
        error=record.error,
    )
    if record.killed_at is None or not per_stream:
        return base
    killed_at = record.killed_at
    t_kill = killed_at - start
    missing = max(sum(c.get(i, {}).get("index_gaps", 0) for i in others) for c in per_stream)
    # A stream a client never heard from in the window was silent for all of it.
    gaps = [c[i]["max_gap_s"] if i in c else end - start for c in per_stream for i in others]
    returns = []
    for stream_id in sorted(killed):
        seen = [c.get(stream_id, {}).get("returned") for c in per_stream]
        if all(isinstance(t, float) for t in seen):
            returns.append(max(float(t) for t in seen if t is not None) - killed_at)
    every_failed = len(record.failed_after_s) == len(killed) and killed
    return base.model_copy(
        update={
            "others_missing": missing,
            "others_max_gap_ms": round(max(gaps) * 1e3, 1) if gaps else None,
            "failed_after_s": max(record.failed_after_s.values()) if every_failed else None,
            "republished": len(returns),
            "republished_s_max": round(max(returns), 3)
            if returns and len(returns) == len(killed)
            else None,
            "republished_s_median": round(statistics.median(returns), 3) if returns else None,
            "clients_connected": not any(
                close.t_s >= t_kill for client in clients for close in client.closes
            ),
        }
    )
