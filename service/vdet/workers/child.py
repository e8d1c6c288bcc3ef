"""What runs inside one stream worker process: its share of the streams, served over its pipe.

`main` is the process's entry point (started with `spawn`, so nothing of the API process's
state, threads or CUDA is inherited). It loads the model and builds `LocalStreams`, exactly as
a one-process `vdet serve` does (vdet.root), with one difference: results go down the pipe
(`_Forwarder`) instead of into a hub here, already encoded for the wire, and the API process
numbers them (so frame work stays out of the API process). Control calls run
on a small thread pool, so a slow call (a removal joining threads) never holds up the others,
and never waits behind frame traffic. A spare is the same process with no stream yet: when it
takes a dead worker's place it is told its new name (`rename`), for its log lines.

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

from vdet.api.schemas import encode_result_tail
from vdet.config.settings import Settings
from vdet.config.streams import StreamSpec
from vdet.core.types import DetectionResult
from vdet.inference.detector import Detector
from vdet.metrics.registry import Metrics
from vdet.root import LocalStreams, default_detector_factory, on_cpu, open_detector
from vdet.workers.channel import (
    Call,
    Channel,
    Fatal,
    Published,
    PublishedBatch,
    Ready,
    Reply,
    Stop,
    portable_error,
)

log = logging.getLogger(__name__)

_CONTROL_THREADS = 4
_PR_SET_PDEATHSIG = 1


@dataclasses.dataclass(frozen=True)
class WorkerConfig:
    """What a worker process is started with (pickled by `spawn`)."""

    name: str
    parent_pid: int
    settings: Settings
    max_streams: int
    env: dict[str, str]  # set before anything else: CUDA_VISIBLE_DEVICES, MPS folders
    cpu_threads: int | None = None


def main(config: WorkerConfig, conn: Connection) -> None:
    """The worker process: start, serve calls until told to stop (or the API process is gone),
    then stop every stream."""
    channel = Channel(conn)
    os.environ.update(config.env)  # CUDA_VISIBLE_DEVICES and MPS, before anything loads CUDA
    _exit_with_parent(config.parent_pid)
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
        streams = LocalStreams.open(
            config.settings,
            forwarder,
            # The API process records every result it receives; this registry is never
            # scraped, it only keeps the stream manager's own bookkeeping.
            Metrics(),
            detector_factory=_detector_factory(config.cpu_threads),
            max_streams=config.max_streams,
        )
    except BaseException as exc:
        log.exception("worker %s could not start", config.name)
        channel.send(Fatal(f"{type(exc).__name__}: {exc}"))
        return
    try:
        forwarder.class_names = streams.class_names
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
        reply = Reply(call.call_id, True, calls.run(call.method, call.args))
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
    """The control calls a worker answers: the API process's `StreamService` calls, and its
    new name when it stops being a spare."""

    def __init__(self, streams: LocalStreams, forwarder: _Forwarder, name: _NameFilter) -> None:
        self._streams = streams
        self._forwarder = forwarder
        self._name = name
        self._methods: dict[str, Callable[..., Any]] = {
            "add": self._add,
            "list": streams.list,
            "get": streams.get,
            "update_params": self._update_params,
            "remove": streams.remove,
            "latest_jpeg": self._latest_jpeg,
            "event_snapshot": streams.event_snapshot,
            "event_snapshots": streams.event_snapshots,
            "detect": streams.detect,
            "health": streams.health,
            "rename": self._rename,
        }

    def run(self, method: str, args: tuple[Any, ...]) -> Any:
        function = self._methods.get(method)
        if function is None:
            raise ValueError(f"unknown worker call {method!r}")
        return function(*args)

    def _add(self, spec: StreamSpec, handle: int) -> Any:
        self._forwarder.bind(spec.id, handle)
        try:
            return self._streams.add(spec)
        except BaseException:
            self._forwarder.remove_source(spec.id)
            raise

    def _rename(self, name: str) -> None:
        log.info("worker %s is now %s", self._name.worker, name)
        self._name.worker = name

    def _latest_jpeg(self, stream_id: str, options: dict[str, Any]) -> Any:
        return self._streams.latest_jpeg(stream_id, **options)

    def _update_params(self, stream_id: str, changes: dict[str, Any]) -> Any:
        return self._streams.update_params(stream_id, **changes)


def _detector_factory(cpu_threads: int | None) -> Callable[[Settings], Detector]:
    """The usual detector; on a CPU worker, ONNX Runtime with its share of the cores."""
    if cpu_threads is None:
        return default_detector_factory

    def open_cpu_detector(settings: Settings) -> Detector:
        if settings.backend not in ("auto", "onnxruntime"):
            return default_detector_factory(settings)
        return open_detector(on_cpu(settings), "onnxruntime", threads=cpu_threads)

    return open_cpu_detector


def _exit_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGKILL this process when the API process dies, however it dies, so a
    killed `vdet serve` leaves no orphan worker holding a GPU."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # it died before prctl took effect
        os._exit(0)
