"""What runs inside one stream worker process: its share of the streams, served over its pipe.

`main` is the process's entry point (started with `spawn`, so nothing of the API process's
state, threads or CUDA is inherited). Its streams are assembled by the function the
composition root named in its `WorkerConfig` (`assemble`: vdet.root builds a worker's
`LocalStreams` as it builds a one-process `vdet serve`'s), with one difference: results go down
the pipe (`_Forwarder`) instead of into a hub here, already encoded for the wire, and the API
process numbers them (so frame work stays out of the API process). Control calls run
on a small thread pool, so a slow call (a removal joining threads) never holds up the others,
and never waits behind frame traffic. A spare is the same process with no stream yet: when it
takes a dead worker's place it is told its new name (`Rename`), for its log lines.

This module must not speak HTTP or hold results: the API process owns both.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import logging
import os
import signal
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any

from vdet.config.settings import Settings
from vdet.core.redact import use_secret_params
from vdet.core.types import DetectionResult
from vdet.metrics.registry import Metrics
from vdet.results.wire import encode_result_tail
from vdet.streams.local import LocalStreams
from vdet.streams.manager import ResultSink
from vdet.workers.channel import (
    AddStream,
    Call,
    ChangeStream,
    Channel,
    DetectImage,
    Fatal,
    GetEventSnapshot,
    GetStream,
    ListEventSnapshots,
    ListStreams,
    Published,
    PublishedBatch,
    Ready,
    RemoveStream,
    Rename,
    Reply,
    ReportHealth,
    Request,
    Stop,
    TakePicture,
    portable_error,
)

log = logging.getLogger(__name__)

_CONTROL_THREADS = 4
_PR_SET_PDEATHSIG = 1

# How a worker's streams are built: (its settings, where results go, a metrics registry, its
# streams at most, its share of the CPU cores or None) -> its streams. The composition root's
# function (vdet.root), named in the config and pickled by reference.
Assemble = Callable[[Settings, ResultSink, Metrics, int, "int | None"], LocalStreams]


@dataclasses.dataclass(frozen=True)
class WorkerConfig:
    """What a worker process is started with (pickled by `spawn`)."""

    name: str
    parent_pid: int
    settings: Settings
    max_streams: int
    env: dict[str, str]  # set before anything else: CUDA_VISIBLE_DEVICES, MPS folders
    assemble: Assemble
    cpu_threads: int | None = None


def main(config: WorkerConfig, conn: Connection) -> None:
    """The worker process: start, serve calls until told to stop (or the API process is gone),
    then stop every stream."""
    channel = Channel(conn)
    os.environ.update(config.env)  # CUDA_VISIBLE_DEVICES and MPS, before anything loads CUDA
    _exit_with_parent(config.parent_pid)
    use_secret_params(config.settings.secret_query_params)
    # Ctrl-C reaches the whole process group; the API process decides when workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    name = _NameFilter(config.name)
    logging.basicConfig(
        level=config.settings.log_level.upper(),
        format="%(asctime)s %(worker)s %(levelname)s %(name)s: %(message)s",
    )
    for handler in logging.getLogger().handlers:
        handler.addFilter(name)
    forwarder = _Forwarder(channel)
    try:
        # The API process records every result it receives; this registry is never scraped,
        # it only keeps the stream manager's own bookkeeping.
        streams = config.assemble(
            config.settings, forwarder, Metrics(), config.max_streams, config.cpu_threads
        )
    except BaseException as exc:
        log.exception("worker %s could not start", config.name)
        channel.send(Fatal(f"{type(exc).__name__}: {exc}"))
        return
    try:
        forwarder.class_names = streams.backend_info.class_names
        channel.send(Ready(os.getpid(), streams.backend_info, streams.describe()))
        _serve(_Calls(streams, forwarder, name), channel)
    finally:
        streams.close()
        log.info("worker %s stopped", name.worker)


def _serve(calls: _Calls, channel: Channel) -> None:
    with ThreadPoolExecutor(_CONTROL_THREADS, thread_name_prefix="vdet-control") as pool:
        while True:
            try:
                message = channel.recv()
            except (EOFError, OSError):
                return  # the API process has gone
            if isinstance(message, Stop):
                return
            if isinstance(message, Call):
                pool.submit(_answer, calls, channel, message)


def _answer(calls: _Calls, channel: Channel, call: Call) -> None:
    try:
        reply = Reply(call.call_id, True, calls.run(call.request))
    except Exception as exc:
        reply = Reply(call.call_id, False, portable_error(exc))
    with contextlib.suppress(OSError):  # the API process has gone: nobody to answer
        channel.send(reply)


class _Forwarder:
    """The stream manager's result sink in a worker: each result goes down the pipe tagged with
    its stream's handle, which lets the API process drop results of a stream it has removed
    (or replaced by a new stream of the same id).

    `publish` only encodes and keeps the result; `flush` sends what was kept as one
    `PublishedBatch`. The stream manager's publisher thread calls both (it flushes after each
    run of results it took at once), and no other thread does."""

    def __init__(self, channel: Channel) -> None:
        self._channel = channel
        self._handles: dict[str, int] = {}
        self._pending: list[Published] = []
        self.class_names: Sequence[str] = ()  # set once the model is loaded

    def bind(self, source_id: str, handle: int) -> None:
        self._handles[source_id] = handle

    def publish(self, result: DetectionResult) -> DetectionResult:
        handle = self._handles.get(result.source_id)
        if handle is not None:
            # Encoded here, on this worker process's publisher thread, rather than by the API
            # process, whose one interpreter carries every worker's results.
            tail = encode_result_tail(result, self.class_names)
            self._pending.append(Published.of(handle, result, tail))
        return result

    def flush(self) -> None:
        if self._pending:
            batch, self._pending = PublishedBatch(tuple(self._pending)), []
            self._channel.send(batch)

    def remove_source(self, source_id: str) -> None:
        self._handles.pop(source_id, None)


class _NameFilter(logging.Filter):
    """Puts the worker's current name on each log record (a spare is renamed when it takes a
    dead worker's place)."""

    def __init__(self, worker: str) -> None:
        super().__init__()
        self.worker = worker

    def filter(self, record: logging.LogRecord) -> bool:
        record.worker = self.worker
        return True


class _Calls:
    """The control calls a worker answers: one handler per `Request` type."""

    def __init__(self, streams: LocalStreams, forwarder: _Forwarder, name: _NameFilter) -> None:
        self._streams = streams
        self._forwarder = forwarder
        self._name = name

    def run(self, request: Request[Any]) -> Any:
        streams = self._streams
        match request:
            case AddStream(spec, handle):
                self._forwarder.bind(spec.id, handle)
                try:
                    return streams.add(spec)
                except BaseException:
                    self._forwarder.remove_source(spec.id)
                    raise
            case ListStreams():
                return streams.list()
            case GetStream(stream_id):
                return streams.get(stream_id)
            case ChangeStream(stream_id, changes):
                return streams.change(stream_id, changes)
            case RemoveStream(stream_id):
                return streams.remove(stream_id)
            case TakePicture(stream_id, picture):
                return streams.picture(stream_id, picture)
            case ListEventSnapshots(stream_id):
                return streams.event_snapshots(stream_id)
            case GetEventSnapshot(stream_id, frame_index):
                return streams.event_snapshot(stream_id, frame_index)
            case DetectImage(image_bgr, params):
                return streams.detect(image_bgr, params)
            case ReportHealth():
                return streams.health()
            case Rename(new_name):
                log.info("worker %s is now %s", self._name.worker, new_name)
                self._name.worker = new_name
                return None
        raise ValueError(f"unknown worker request {type(request).__name__}")


def _exit_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGKILL this process when the API process dies, however it dies, so a
    killed `vdet serve` leaves no orphan worker holding a GPU."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # it died before prctl took effect
        os._exit(0)
