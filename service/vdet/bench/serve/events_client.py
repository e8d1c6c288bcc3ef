"""One WebSocket client of /v1/events in its own process, measuring what a user's client sees.

Each client runs in a process of its own (spawned), with its own event loop, so that K clients
parsing thousands of results per second do not share one interpreter with each other or with
the control loop: the benchmark must not be what limits the figures, and each client reports
its own CPU use so that the run can show it was not.

Measured per window of wall-clock time, by the time a message was received:
- results received (those of the measured streams, by id prefix; others counted apart), and
  per stream, for the slowest stream's rate;
- latency from the frame's arrival (`arrival_time`: the server's `time.time()` when the packet
  completing the frame was read, or released by the pacing of a file) to receipt here
  (`time.time()` too): comparable because both run on one host's wall clock. A server on
  another host would need synchronised clocks. The server's own part (`published_time -
  arrival_time`) is kept beside it, so the rest is the delivery (hub -> WebSocket -> here);
- frames dropped as gaps in each stream's `frame_index`, results missed here as gaps in the
  global `seq`, and anything out of order;
- every close (code, reason, and the `lagging`/`shutdown` event before it); the client then
  resumes with `?after=<last seq>` as the API contract says a client should;
- per measured stream: its results, frame-index gaps, the longest time without a result
  (window edges included) and, once told of a kill, when its first result of a frame that
  arrived after the kill was received (the parent knows which streams the killed worker ran).

Commands come from the parent over a `multiprocessing` connection: `("window", start, end,
prefix)`, `("kill", time)` (a worker was killed at that wall-clock time), `("collect",)`
(answered with the last window's figures as a dict, the per-stream ones under `per_stream`)
and `("stop",)`.
The first thing sent back is `("ready", None)` once connected, or `("failed", reason)`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from array import array
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from vdet.bench.stats import percentiles

LATENCY_SAMPLES_KEPT = 1000
SLOWEST_KEPT = 40  # the window's slowest results, kept whole: which stream, when, whose part
_LAG_PROBE_S = 0.005
_RECONNECT_PAUSE_S = 0.2
_MAX_MESSAGE_BYTES = 16 << 20


def latency_summary_ms(seconds: array[float] | list[float]) -> dict[str, float] | None:
    """p50/p90/p99/max/mean in ms and the count; None for no samples."""
    if not seconds:
        return None
    a = np.asarray(seconds, dtype=np.float64) * 1e3
    return {
        **{key: round(value, 3) for key, value in percentiles(a, (50, 90, 99)).items()},
        "max": round(float(a.max()), 3),
        "mean": round(float(a.mean()), 3),
        "n": int(a.size),
    }


def latency_samples_ms(seconds: array[float] | list[float], kept: int) -> list[float]:
    """At most `kept` evenly spaced quantiles of the samples in ms (for a CDF plot)."""
    if not seconds:
        return []
    a = np.sort(np.asarray(seconds, dtype=np.float64)) * 1e3
    if a.size > kept:
        a = a[np.linspace(0, a.size - 1, kept).round().astype(np.int64)]
    return [round(float(v), 3) for v in a]


def slowest_results(window: _Window, kept: int) -> list[dict[str, Any]]:
    """The `kept` results of the window with the highest latency, slowest first: when each was
    received, its stream, and the server's part of its latency (a tail made by one stream, by
    one worker or by the delivery reads differently here)."""
    if not window.latency:
        return []
    latency = np.asarray(window.latency, dtype=np.float64)
    order = np.argsort(latency)[::-1][:kept]
    return [
        {
            "t_s": round(window.received[i] - window.start, 4),
            "source": window.sources[i],
            "latency_ms": round(latency[i] * 1e3, 2),
            "server_ms": round(window.server_part[i] * 1e3, 2),
        }
        for i in order.tolist()
    ]


def p99_per_second_ms(
    received: array[float] | list[float], latency: array[float] | list[float], start: float
) -> list[float | None]:
    """p99 latency (ms) of the samples received in each whole second from `start` (None for a
    second without any)."""
    if not received:
        return []
    second = ((np.asarray(received, dtype=np.float64) - start) // 1.0).astype(np.int64)
    values = np.asarray(latency, dtype=np.float64) * 1e3
    out: list[float | None] = []
    for s in range(int(second.max()) + 1):
        inside = values[second == s]
        out.append(round(float(np.percentile(inside, 99)), 2) if inside.size else None)
    return out


@dataclass(slots=True)
class _StreamTrack:
    """One measured stream at this client in one window."""

    last_received: float  # the window's start until its first result
    results: int = 0
    index_gaps: int = 0
    max_gap_s: float = 0.0
    returned: float | None = None  # receipt of its first result of a frame after the kill

    def figures(self, window_end: float) -> dict[str, Any]:
        return {
            "results": self.results,
            "index_gaps": self.index_gaps,
            "max_gap_s": round(max(self.max_gap_s, window_end - self.last_received), 4),
            "returned": self.returned,
        }


@dataclass
class _Window:
    start: float
    end: float
    prefix: str
    results: int = 0
    other_results: int = 0
    latency: array[float] = field(default_factory=lambda: array("d"))
    received: array[float] = field(default_factory=lambda: array("d"))
    server_part: array[float] = field(default_factory=lambda: array("d"))
    sources: list[str] = field(default_factory=list)
    loop_lag_max_per_s: list[float] = field(default_factory=list)
    per_source: Counter[str] = field(default_factory=Counter)
    index_gaps: int = 0
    seq_gaps: int = 0
    out_of_order: int = 0
    gap_events: int = 0
    closes: list[dict[str, Any]] = field(default_factory=list)
    cpu_start: float | None = None
    cpu_end: float | None = None
    streams: dict[str, _StreamTrack] = field(default_factory=dict)
    killed_at: float | None = None

    def figures(self) -> dict[str, Any]:
        seconds = self.end - self.start
        rates = [n / seconds for n in self.per_source.values()]
        cpu = (
            (self.cpu_end - self.cpu_start) / seconds * 100
            if self.cpu_start is not None and self.cpu_end is not None
            else None
        )
        return {
            "window_s": round(seconds, 3),
            "results": self.results,
            "results_per_s": round(self.results / seconds, 2),
            "streams_seen": len(self.per_source),
            "slowest_stream_results_per_s": round(min(rates), 2) if rates else None,
            "other_results": self.other_results,
            "latency_ms": latency_summary_ms(self.latency),
            "server_latency_ms": latency_summary_ms(self.server_part),
            "latency_samples_ms": latency_samples_ms(self.latency, LATENCY_SAMPLES_KEPT),
            "latency_p99_per_s_ms": p99_per_second_ms(self.received, self.latency, self.start),
            "loop_lag_max_per_s_ms": [round(v * 1e3, 2) for v in self.loop_lag_max_per_s],
            "slowest": slowest_results(self, SLOWEST_KEPT),
            "dropped_frame_index_gaps": self.index_gaps,
            "missed_seq_gaps": self.seq_gaps,
            "out_of_order": self.out_of_order,
            "gap_events": self.gap_events,
            "closes": self.closes,
            "cpu_percent": round(cpu, 1) if cpu is not None else None,
            "per_stream": {k: v.figures(self.end) for k, v in self.streams.items()},
        }


class EventsClient:
    """The client's state: one connection at a time, resumed after each close."""

    def __init__(self, url: str, conn: Connection) -> None:
        self.url = url
        self.conn = conn
        self.last_seq: int | None = None
        self.last_index: dict[str, int] = {}
        self.window: _Window | None = None
        self.last_end_event: str | None = None
        self.closes_total = 0
        self.stopping = asyncio.Event()
        self._ws: ClientConnection | None = None
        self._announced = False
        self._probe: asyncio.Task[None] | None = None  # the current window's lag probe

    # ------------------------------------------------------------------ commands

    def _on_command(self) -> None:
        try:
            command = self.conn.recv()
        except EOFError:  # the parent is gone
            self._stop()
            return
        kind = command[0]
        if kind == "window":
            _, start, end, prefix = command
            window = self.window = _Window(start, end, prefix)
            loop = asyncio.get_running_loop()
            loop.call_later(max(0.0, start - time.time()), self._mark_cpu, window, "cpu_start")
            loop.call_later(max(0.0, end - time.time()), self._mark_cpu, window, "cpu_end")
            self._probe = loop.create_task(self._probe_lag(window))
        elif kind == "kill" and self.window is not None:
            self.window.killed_at = command[1]
        elif kind == "collect":
            figures = self.window.figures() if self.window is not None else {}
            figures["closes_total"] = self.closes_total
            self.conn.send(("figures", figures))
        elif kind == "stop":
            self._stop()

    @staticmethod
    async def _probe_lag(window: _Window) -> None:
        """This client's own event-loop lag, its maximum in each second of the window: a late
        result that this process was too busy to read is the benchmark's, not the server's."""
        await asyncio.sleep(max(0.0, window.start - time.time()))
        while (now := time.time()) < window.end:
            await asyncio.sleep(_LAG_PROBE_S)
            lag = max(0.0, time.time() - now - _LAG_PROBE_S)
            second = int(now - window.start)
            while len(window.loop_lag_max_per_s) <= second:
                window.loop_lag_max_per_s.append(0.0)
            window.loop_lag_max_per_s[second] = max(window.loop_lag_max_per_s[second], lag)

    @staticmethod
    def _mark_cpu(window: _Window, which: str) -> None:
        setattr(window, which, time.process_time())

    def _stop(self) -> None:
        self.stopping.set()
        if self._ws is not None:
            asyncio.get_running_loop().create_task(self._ws.close())

    # ------------------------------------------------------------------ messages

    def _on_message(self, raw: str | bytes) -> None:
        received = time.time()
        message = json.loads(raw)
        kind = message.get("type")
        window = self.window
        in_window = window is not None and window.start <= received < window.end
        if kind != "result":
            if kind == "gap" and in_window and window is not None:
                window.gap_events += 1
            elif kind in ("lagging", "shutdown", "stream_removed"):
                self.last_end_event = kind
            return
        result = message["result"]
        seq, source, index = result["seq"], result["source_id"], result["frame_index"]
        previous_seq, previous_index = self.last_seq, self.last_index.get(source)
        if previous_seq is None or seq > previous_seq:
            self.last_seq = seq
        self.last_index[source] = index
        if not in_window or window is None:
            return
        if previous_seq is not None:
            if seq > previous_seq + 1:
                window.seq_gaps += seq - previous_seq - 1
            elif seq <= previous_seq:
                window.out_of_order += 1
        if not source.startswith(window.prefix):
            window.other_results += 1
            return
        window.results += 1
        window.per_source[source] += 1
        arrival = result["arrival_time"]
        window.latency.append(received - arrival)
        window.received.append(received)
        window.server_part.append(result["published_time"] - arrival)
        window.sources.append(source)
        track = window.streams.get(source)
        if track is None:
            track = window.streams[source] = _StreamTrack(last_received=window.start)
        track.results += 1
        track.max_gap_s = max(track.max_gap_s, received - track.last_received)
        track.last_received = received
        if track.returned is None and window.killed_at is not None and arrival >= window.killed_at:
            track.returned = received
        if previous_index is not None:
            if index > previous_index + 1:
                window.index_gaps += index - previous_index - 1
                track.index_gaps += index - previous_index - 1
            elif index <= previous_index:
                window.out_of_order += 1

    def _on_close(self, code: int, reason: str) -> None:
        self.closes_total += 1
        now = time.time()
        window = self.window
        if window is not None and window.start <= now < window.end:
            window.closes.append(
                {
                    "t_s": round(now - window.start, 3),
                    "code": code,
                    "reason": reason,
                    "event": self.last_end_event,
                }
            )
        self.last_end_event = None

    # ------------------------------------------------------------------ connection

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_reader(self.conn.fileno(), self._on_command)
        try:
            while not self.stopping.is_set():
                url = self.url if self.last_seq is None else f"{self.url}?after={self.last_seq}"
                try:
                    async with connect(url, max_size=_MAX_MESSAGE_BYTES) as ws:
                        self._ws = ws
                        if self.stopping.is_set():  # told to stop while connecting
                            return
                        if not self._announced:
                            self._announced = True
                            self.conn.send(("ready", None))
                        async for raw in ws:
                            self._on_message(raw)
                        code, reason = (ws.close_code or 1006), (ws.close_reason or "")
                except ConnectionClosed as exc:
                    code = exc.rcvd.code if exc.rcvd is not None else 1006
                    reason = exc.rcvd.reason if exc.rcvd is not None else str(exc)
                except (OSError, InvalidHandshake, TimeoutError) as exc:
                    if not self._announced:
                        self._announced = True
                        self.conn.send(("failed", f"{type(exc).__name__}: {exc}"))
                        return
                    code, reason = 1006, f"{type(exc).__name__}: {exc}"
                finally:
                    self._ws = None
                if self.stopping.is_set():
                    return
                self._on_close(code, reason)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), _RECONNECT_PAUSE_S)
        finally:
            loop.remove_reader(self.conn.fileno())


def client_main(url: str, conn: Connection) -> None:
    """Process entry point (spawn): run one client until told to stop."""
    asyncio.run(EventsClient(url, conn).run())
