"""The API process's side of the stream worker processes: start, supervise, route, collect.

`WorkerPool` is the `StreamService` (vdet.streams.service) of a `vdet serve` whose streams run
in worker processes (vdet.workers.plan says how many, and on which GPU). It
- starts every worker with `spawn`, always from its one long-lived supervisor thread: Linux
  sends a worker its parent-death signal when the *thread* that started it ends, so no
  short-lived thread may start one;
- places a new stream: its GPU by the node's rules (pinned, sticky, least loaded:
  vdet.gpu.placement), then the least-loaded worker of that GPU with room. A stream never moves;
- sends each control call (a `Request` of vdet.workers.channel) to the worker that owns the
  stream and waits for its reply, up to `workers.call_timeout_s` (then WorkerUnavailableError,
  which the API answers with 503);
- reads every worker's pipe on the API's event loop, or on one thread without a loop
  (vdet.workers.inbox): results are numbered by the
  one results hub here (a single seq across processes, so WebSocket resume works as before)
  and recorded in the one metrics registry; replies complete their calls;
- notices a worker that dies (its process sentinel, within a fraction of a second), shows its
  streams `failed` with the reason, and adds the same streams (same ids and settings) to the
  process that takes its place: a ready spare of its GPU (`workers.spares`: idle worker
  processes, started and warmed like the others, so the streams run again without waiting for
  a model to load), which then serves under the dead worker's name while a new spare starts;
  or, with no spare ready, a new process, after a growing pause if it keeps dying. The other
  workers' streams never notice.

It runs no frame work and holds no frames: results arrive ready, snapshots arrive as JPEG.
"""

from __future__ import annotations

import asyncio
import builtins
import collections
import contextlib
import dataclasses
import itertools
import logging
import multiprocessing
import multiprocessing.connection
import os
import queue
import signal
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Literal, TypeVar

from vdet.config.settings import Settings
from vdet.config.streams import StreamSpec
from vdet.core.contract import PostprocessParams
from vdet.core.redact import redact
from vdet.core.types import Detections, ImageArray, SourceState, SourceStatus, StageTimings
from vdet.gpu.placement import PlacementError, SourceDemand, assign
from vdet.ingest.urls import SourcePolicy, validate_source_url
from vdet.metrics.registry import Metrics
from vdet.results.hub import ResultsHub
from vdet.streams.event_snapshots import EventSnapshot, EventSnapshotCounts
from vdet.streams.params import stream_class_thresholds, stream_params
from vdet.streams.service import (
    BackendInfo,
    DuplicateStreamError,
    EncodedFrame,
    EventSnapshotList,
    LimitError,
    PictureRequest,
    StreamChanges,
    StreamError,
    StreamUnavailableError,
    StreamView,
    UnknownStreamError,
    view_of_spec,
)
from vdet.workers import child
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
)
from vdet.workers.child import Assemble
from vdet.workers.inbox import Inbox
from vdet.workers.mps import MpsDaemon, start_mps
from vdet.workers.plan import WorkerPlan, child_visible_devices

log = logging.getLogger(__name__)

T = TypeVar("T")

# A worker that died this soon after starting is restarted after a growing pause, so a model
# that cannot load does not become a tight loop of process starts.
_QUICK_DEATH_S = 30.0
_RESTART_BACKOFF_S = (0.0, 1.0, 2.0, 5.0, 10.0, 30.0)
_SUPERVISOR_TICK_S = 0.2
_STOP_GRACE_S = 6.0
# How long a /metrics scrape waits for the workers' counts.
_SCRAPE_WAIT_S = 2.0


class WorkerUnavailableError(StreamUnavailableError):
    """The worker that owns a stream is not answering: restarting, or slower than the call
    timeout. Retrying later can succeed."""


@dataclasses.dataclass
class _RemoteStream:
    """A stream as the API process knows it: what was asked, which worker runs it."""

    spec: StreamSpec
    handle: int  # tags its results; a new stream of the same id gets a new one
    worker: int
    removing: bool = False
    failed: str | None = None  # why it does not run now (its worker died); None while it runs


Role = Literal["worker", "spare"]


@dataclasses.dataclass(frozen=True)
class WorkerView:
    """One worker process slot, for `GET /v1/workers` and logs."""

    name: str
    role: Role
    gpu: str
    pid: int | None
    alive: bool
    streams: int
    restarts: int
    last_exit: str | None


class _Process:
    """One started worker process and its pipe, with the calls waiting for its replies.

    It serves one slot at a time (`slot`): a spare's process moves to a worker slot when it
    takes a dead worker's place, and its pipe and its waiting calls move with it. `slot`
    changes only on the supervisor thread, under the pool's lock."""

    def __init__(
        self, process: multiprocessing.process.BaseProcess, channel: Channel, slot: _Worker
    ) -> None:
        self.process = process
        self.channel = channel
        self.slot = slot
        self.alive = False  # True from its Ready until its pipe closes
        self.info: Ready | None = None
        self.reaped = False  # its end was handled (by the supervisor, once)
        self._lock = threading.Lock()
        self._pending: dict[int, Future[Any]] = {}
        self._ids = itertools.count(1)

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def call_async(self, request: Request[T]) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            if not self.alive:
                future.set_exception(
                    WorkerUnavailableError(f"worker {self.slot.name} is restarting; retry shortly")
                )
                return future
            call_id = next(self._ids)
            self._pending[call_id] = future
        try:
            self.channel.send(Call(call_id, request))
        except (OSError, ValueError) as exc:
            self._settle(call_id, WorkerUnavailableError(f"worker {self.slot.name} is gone: {exc}"))
        return future

    def call(self, request: Request[T], *, timeout: float) -> T:
        future = self.call_async(request)
        try:
            return future.result(timeout)
        except FutureTimeout:
            what = type(request).__name__
            raise WorkerUnavailableError(
                f"worker {self.slot.name} did not answer {what} within {timeout:g} s"
            ) from None

    def reply(self, message: Reply) -> None:
        if message.ok:
            with self._lock:
                future = self._pending.pop(message.call_id, None)
            if future is not None and not future.done():
                future.set_result(message.value)
        else:
            self._settle(message.call_id, message.value)

    def _settle(self, call_id: int, error: BaseException) -> None:
        with self._lock:
            future = self._pending.pop(call_id, None)
        if future is not None and not future.done():
            future.set_exception(error)

    def fail_pending(self, reason: str) -> None:
        with self._lock:
            self.alive = False
            pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(WorkerUnavailableError(reason))


class _Worker:
    """One worker slot: a name (`w0`, ... for workers, `spare0`, ... for spares), a GPU, and
    the process that serves it now. Its process is replaced when it dies; calls go to the
    current one. A worker slot's counts (streams, restarts) survive its processes."""

    def __init__(self, index: int, gpu: int | None, role: Role = "worker") -> None:
        self.index = index
        self.gpu = gpu
        self.role: Role = role
        self.name = f"w{index}" if role == "worker" else f"spare{index}"
        self.gpu_label = "cpu" if gpu is None else str(gpu)
        self.current: _Process | None = None
        self.since = 0.0  # when the current process started serving this slot
        self.start_error: str | None = None
        self.ready = threading.Event()  # the current process reported Ready, Fatal, or ended
        self.restarts = 0
        self.quick_deaths = 0
        self.last_exit: str | None = None

    @property
    def pid(self) -> int | None:
        current = self.current
        return current.pid if current is not None else None

    @property
    def alive(self) -> bool:
        current = self.current
        return current is not None and current.alive

    @property
    def info(self) -> Ready | None:
        current = self.current
        return current.info if current is not None else None

    def call_async(self, request: Request[T]) -> Future[T]:
        current = self.current
        if current is None:
            future: Future[T] = Future()
            future.set_exception(
                WorkerUnavailableError(f"worker {self.name} is restarting; retry shortly")
            )
            return future
        return current.call_async(request)

    def call(self, request: Request[T], *, timeout: float) -> T:
        current = self.current
        if current is None:
            raise WorkerUnavailableError(f"worker {self.name} is restarting; retry shortly")
        return current.call(request, timeout=timeout)


class WorkerPool:
    """The streams of this service, run by worker processes (module docstring)."""

    def __init__(
        self,
        settings: Settings,
        plan: WorkerPlan,
        hub: ResultsHub,
        metrics: Metrics,
        assemble: Assemble,
        loop: asyncio.AbstractEventLoop | None = None,
    ):
        if plan.processes < 1:
            raise ValueError("a WorkerPool needs at least one worker process")
        self._settings = settings
        self._plan = plan
        self._hub = hub
        self._metrics = metrics
        self._assemble = assemble
        self._workers = tuple(_Worker(i, gpu) for i, gpu in enumerate(plan.gpus))
        self._spares = tuple(_Worker(i, gpu, "spare") for i, gpu in enumerate(plan.spare_gpus))
        self._slots = self._workers + self._spares
        # Guards _streams, _closed, and which process serves which slot.
        self._lock = threading.Lock()
        self._streams: dict[str, _RemoteStream] = {}
        self._handles = itertools.count(1)
        self._closed = False
        self._mps: MpsDaemon | None = None
        self.mps_active = False
        self._round_robin = itertools.count()
        self._spawn_requests: queue.SimpleQueue[_Worker] = queue.SimpleQueue()
        # On the API's event loop when there is one (vdet.workers.inbox says why).
        self._inbox = Inbox(loop)
        self._supervisor = threading.Thread(
            target=self._supervise, name="vdet-worker-supervisor", daemon=True
        )
        self._backend_info: BackendInfo = BackendInfo("", "", "", "", ())

    @classmethod
    def start(
        cls,
        settings: Settings,
        plan: WorkerPlan,
        hub: ResultsHub,
        metrics: Metrics,
        assemble: Assemble,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> WorkerPool:
        """Start every worker (and spare) and wait until each worker has loaded its model;
        RuntimeError naming the worker and its error if one cannot. `assemble` builds each
        worker's streams in its process (vdet.workers.child). The workers' pipes are read on
        `loop` when given (it must keep running meanwhile: call this off it), else on a thread
        of the pool's own."""
        pool = cls(settings, plan, hub, metrics, assemble, loop)
        try:
            pool._mps = start_mps(settings.gpu.mps, plan.shared_gpus())
            pool.mps_active = pool._mps is not None and pool._mps.active
            metrics.mps_active.set(1.0 if pool.mps_active else 0.0)
            pool._supervisor.start()
            # Spares start with the workers but are not waited for: the service can serve
            # without them, and one that is not ready yet only means a slower restart.
            for slot in pool._slots:
                pool._spawn_requests.put(slot)
            deadline = time.monotonic() + settings.workers.start_timeout_s
            for worker in pool._workers:
                if not worker.ready.wait(max(0.0, deadline - time.monotonic())):
                    raise RuntimeError(
                        f"worker {worker.name} did not start within "
                        f"{settings.workers.start_timeout_s:g} s (workers.start_timeout_s)"
                    )
                if worker.info is None:
                    raise RuntimeError(
                        f"worker {worker.name} could not start: {worker.start_error}"
                    )
        except BaseException:
            pool.close()
            raise
        first = pool._workers[0].info
        assert first is not None  # every worker reported ready above
        pool._backend_info = first.backend
        return pool

    @property
    def backend_info(self) -> BackendInfo:
        return self._backend_info

    # --- StreamControl ---------------------------------------------------------------------

    def add(self, spec: StreamSpec) -> StreamView:
        # Checked here as well as in the worker, so a bad stream costs no round trip and a
        # source the policy refuses never reaches a worker process (ValueError: 422).
        policy = SourcePolicy.of(self._settings.ingest.source_policy)
        validate_source_url(spec.url, policy)
        names = self._backend_info.class_names
        stream_class_thresholds(spec, stream_params(spec, self._settings.detection, names), names)
        with self._lock:
            if self._closed:
                raise StreamError("the service is shutting down")
            if (existing := self._streams.get(spec.id)) is not None:
                state = "is still being removed" if existing.removing else "already exists"
                raise DuplicateStreamError(f"stream {spec.id!r} {state}")
            if len(self._streams) >= self._settings.max_streams:
                raise LimitError(
                    f"stream limit reached ({self._settings.max_streams}); delete a stream first"
                )
            worker = self._place(spec)
            stream = _RemoteStream(spec, next(self._handles), worker.index)
            self._streams[spec.id] = stream
        try:
            view = worker.call(AddStream(spec, stream.handle), timeout=self._call_timeout)
        except WorkerUnavailableError:
            # It may still have added the stream: make sure nothing of it is left running.
            worker.call_async(RemoveStream(spec.id))
            self._forget(stream)
            raise
        except BaseException:
            self._forget(stream)
            raise
        self._metrics.add_source(spec.id, view.status.state, gpu=worker.gpu_label)
        self._metrics.set_stream_count(len(self))
        return self._tag(view, worker)

    def list(self) -> list[StreamView]:
        with self._lock:
            streams = [s for s in self._streams.values() if not s.removing]
        by_worker: dict[int, list[_RemoteStream]] = collections.defaultdict(list)
        for stream in streams:
            by_worker[stream.worker].append(stream)
        asked = {
            index: self._workers[index].call_async(ListStreams())
            for index, owned in by_worker.items()
            if any(s.failed is None for s in owned)
        }
        views: list[StreamView] = []
        for index, owned in by_worker.items():
            worker = self._workers[index]
            running: dict[str, StreamView] = {}
            if index in asked:
                try:
                    running = {v.spec.id: v for v in asked[index].result(self._call_timeout)}
                except (FutureTimeout, WorkerUnavailableError) as exc:
                    reason = str(exc) or f"worker {worker.name} did not answer"
                    views.extend(self._failed_view(s, worker, reason) for s in owned)
                    continue
            for stream in owned:
                view = running.get(stream.spec.id)
                if view is not None:
                    views.append(self._tag(view, worker))
                else:
                    reason = stream.failed or f"worker {worker.name} lost the stream"
                    views.append(self._failed_view(stream, worker, reason))
        return sorted(views, key=lambda v: v.spec.id)

    def get(self, stream_id: str) -> StreamView:
        stream = self._stream(stream_id)
        worker = self._workers[stream.worker]
        if stream.failed is not None:
            return self._failed_view(stream, worker, stream.failed)
        try:
            view = worker.call(GetStream(stream_id), timeout=self._call_timeout)
        except WorkerUnavailableError as exc:  # it died a moment ago: say so, as list() does
            return self._failed_view(stream, worker, str(exc))
        return self._tag(view, worker)

    def change(self, stream_id: str, changes: StreamChanges) -> StreamView:
        stream = self._stream(stream_id)
        worker = self._workers[stream.worker]
        view = worker.call(ChangeStream(stream_id, changes), timeout=self._call_timeout)
        with self._lock:
            stream.spec = view.spec  # a restarted worker gets the stream as it is now
        return self._tag(view, worker)

    def remove(self, stream_id: str) -> None:
        with self._lock:
            stream = self._streams.get(stream_id)
            if stream is None or stream.removing:
                raise UnknownStreamError(f"no stream {stream_id!r}")
            stream.removing = True  # its results are dropped from here on
        try:
            worker = self._workers[stream.worker]
            if stream.failed is None:
                try:
                    worker.call(RemoveStream(stream_id), timeout=self._call_timeout)
                except (UnknownStreamError, WorkerUnavailableError) as exc:
                    log.warning(
                        "removing %s from worker %s: %s", stream_id, worker.name, redact(str(exc))
                    )
        finally:
            self._forget(stream)
            self._hub.remove_source(stream_id)
            self._metrics.remove_source(stream_id)
            self._metrics.set_stream_count(len(self))

    def __contains__(self, stream_id: object) -> bool:
        stream = self._streams.get(stream_id) if isinstance(stream_id, str) else None
        return stream is not None and not stream.removing

    def __len__(self) -> int:
        return len(self._streams)

    def picture(self, stream_id: str, request: PictureRequest) -> EncodedFrame | None:
        stream = self._stream(stream_id)
        latest_seq = self._hub.latest_seq(stream_id)
        if stream.failed is not None or latest_seq is None:
            return None  # no result yet: known here, without asking the worker
        worker = self._workers[stream.worker]
        frame = worker.call(TakePicture(stream_id, request), timeout=self._call_timeout)
        if frame is None:
            return None
        # The worker does not know the seq the hub gave the frame's result (that result may
        # still be on its way here): look it up by the index of the frame it was detected on.
        numbered = self._hub.find(stream_id, frame.result_frame_index, wait_s=0.1)
        return dataclasses.replace(frame, seq=latest_seq if numbered is None else numbered.seq)

    def event_snapshot(self, stream_id: str, frame_index: int) -> EventSnapshot | None:
        stream = self._stream(stream_id)
        if stream.failed is not None:
            return None  # its worker died, and the snapshots it kept with it
        worker = self._workers[stream.worker]
        return worker.call(GetEventSnapshot(stream_id, frame_index), timeout=self._call_timeout)

    def event_snapshots(self, stream_id: str) -> EventSnapshotList:
        stream = self._stream(stream_id)
        if stream.failed is not None:
            return [], EventSnapshotCounts()
        worker = self._workers[stream.worker]
        return worker.call(ListEventSnapshots(stream_id), timeout=self._call_timeout)

    def detect(
        self, image_bgr: ImageArray, params: PostprocessParams
    ) -> tuple[Detections, StageTimings]:
        alive = [w for w in self._workers if w.alive]
        if not alive:
            raise WorkerUnavailableError("no worker process is running; retry shortly")
        worker = alive[next(self._round_robin) % len(alive)]
        return worker.call(DetectImage(image_bgr, params), timeout=self._call_timeout)

    def sync_metrics(self) -> None:
        """Fold every worker's stream counters into the metrics. A worker that does not answer
        within `_SCRAPE_WAIT_S` (busy starting streams, say) keeps its last values: a scrape
        must not wait for it. Spares are asked too: they hold no stream, but their GPU memory
        is in use."""
        asked = [(w, w.call_async(ReportHealth())) for w in self._slots if w.alive]
        deadline = time.monotonic() + _SCRAPE_WAIT_S
        gpu_streams: dict[str, int] = collections.defaultdict(int)
        gpu_memory: dict[str, int] = collections.defaultdict(int)
        now = time.time()
        for worker in self._slots:
            self._metrics.set_worker_up(worker.name, worker.gpu_label, worker.alive)
            gpu_streams[worker.gpu_label] += 0
        for worker, future in asked:
            try:
                health = future.result(max(0.0, deadline - time.monotonic()))
            except (FutureTimeout, WorkerUnavailableError):
                log.warning("worker %s did not report its streams in time", worker.name)
                continue
            for source_id, status in health.sources:
                if source_id in self:
                    self._metrics.sync_source(source_id, status, now=now)
                    self._metrics.set_source_state(source_id, status.state)
            for source_id, counts in health.event_snapshots:
                if source_id in self:
                    self._metrics.sync_event_snapshots(
                        source_id, counts.kept, counts.skipped, counts.failed
                    )
            for _, streams, memory in health.gpus:
                gpu_streams[worker.gpu_label] += streams
                if memory is not None:
                    gpu_memory[worker.gpu_label] += memory
        with self._lock:
            failed = [s.spec.id for s in self._streams.values() if s.failed is not None]
        for source_id in failed:
            self._metrics.set_source_state(source_id, SourceState.FAILED)
        for label, streams in gpu_streams.items():
            self._metrics.set_gpu_usage(label, streams=streams, memory_bytes=gpu_memory.get(label))

    def describe(self) -> str:
        per_gpu = ""
        if gpus := self._plan.gpu_indices:
            per_gpu = f" ({self._plan.gpus.count(gpus[0])} per GPU on GPU(s) {list(gpus)})"
        mps = ", MPS on" if self.mps_active else ""
        spares = f", {len(self._spares)} spare(s)" if self._spares else ""
        b = self._backend_info
        processes = f"{len(self._workers)} worker processes{per_gpu}{spares}"
        return f"{b.backend} on {b.device} in {processes}{mps}"

    def processes_alive(self) -> int:
        """Worker processes (not spares) that serve now."""
        return sum(w.alive for w in self._workers)

    def workers(self) -> builtins.list[WorkerView]:
        """Every slot, workers first, then spares (which hold no stream)."""
        with self._lock:
            load = collections.Counter(s.worker for s in self._streams.values())
            return [
                WorkerView(
                    name=w.name,
                    role=w.role,
                    gpu=w.gpu_label,
                    pid=w.pid,
                    alive=w.alive,
                    streams=load[w.index] if w.role == "worker" else 0,
                    restarts=w.restarts,
                    last_exit=w.last_exit,
                )
                for w in self._slots
            ]

    def close(self) -> None:
        """Stop every worker (each stops its streams), waiting up to a few seconds before
        terminating those that do not exit; then the MPS daemon this pool started. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        # The supervisor stops first: two threads reaping one process would race, and no
        # spare may start or take a slot from here on.
        if self._supervisor.is_alive():
            self._supervisor.join(5.0)
        # Workers and spares stop together, so spares add nothing to the time it takes.
        processes = [p for p in (w.current for w in self._slots) if p is not None]
        for proc in processes:
            if proc.info is None:
                # Still loading its model (a spare, or a worker being restarted): it holds no
                # stream, and it would read Stop only once loaded.
                proc.process.terminate()
                continue
            with contextlib.suppress(OSError, ValueError):  # already gone
                proc.channel.send(Stop())
        deadline = time.monotonic() + _STOP_GRACE_S
        for proc in processes:
            proc.process.join(max(0.0, deadline - time.monotonic()))
        for proc in processes:
            if proc.process.is_alive():
                log.warning("worker %s did not stop in time; terminating it", proc.slot.name)
                proc.process.terminate()
                proc.process.join(2.0)
                if proc.process.is_alive():
                    proc.process.kill()
                    proc.process.join(1.0)
            proc.fail_pending("the service is shutting down")
        self._inbox.close()
        for proc in processes:
            proc.channel.close()  # (idempotent: most were closed at their EOF)
        if self._mps is not None:
            self._mps.stop()

    # --- internals -------------------------------------------------------------------------

    @property
    def _call_timeout(self) -> float:
        return self._settings.workers.call_timeout_s

    def _stream(self, stream_id: str) -> _RemoteStream:
        stream = self._streams.get(stream_id)
        if stream is None or stream.removing:
            raise UnknownStreamError(f"no stream {stream_id!r}")
        return stream

    def _forget(self, stream: _RemoteStream) -> None:
        with self._lock:
            if self._streams.get(stream.spec.id) is stream:
                del self._streams[stream.spec.id]

    def _tag(self, view: StreamView, worker: _Worker) -> StreamView:
        return dataclasses.replace(view, worker=worker.name)

    def _failed_view(self, stream: _RemoteStream, worker: _Worker, reason: str) -> StreamView:
        status = SourceStatus(state=SourceState.FAILED, last_error=reason)
        names = self._backend_info.class_names
        view = view_of_spec(stream.spec, self._settings.detection, names, status)
        return dataclasses.replace(view, worker=worker.name)

    def _place(self, spec: StreamSpec) -> _Worker:
        """The worker for a new stream (caller holds the lock); PlacementError or LimitError."""
        load = collections.Counter(s.worker for s in self._streams.values())
        per_process = self._plan.streams_per_process
        candidates: Iterable[_Worker] = self._workers
        gpus = self._plan.gpu_indices
        if gpus:
            gpu = gpus[self._choose_gpu(spec, gpus)]
            candidates = [w for w in self._workers if w.gpu == gpu]
        elif spec.gpu is not None:
            raise PlacementError(f"stream {spec.id!r} asks for gpu {spec.gpu}, but no GPU is used")
        open_workers = [w for w in candidates if w.alive and load[w.index] < per_process]
        if not open_workers:
            where = "" if not gpus else f" of GPU {gpu}"
            if per_process == self._settings.workers.streams_per_process:
                share = "workers.streams_per_process"
            else:  # `auto` raised the share past the process cap (vdet.workers.plan)
                share = "max_streams over the GPU's worker processes, workers.processes auto"
            raise LimitError(
                f"every running worker process{where} already has {per_process} stream(s) "
                f"({share}) or is restarting; delete a stream or start more worker "
                f"processes (workers.processes)"
            )
        return min(open_workers, key=lambda w: (load[w.index], w.index))

    def _choose_gpu(self, spec: StreamSpec, gpus: tuple[int, ...]) -> int:
        position = {gpu: i for i, gpu in enumerate(gpus)}
        pinned = None
        if spec.gpu is not None:
            pinned = position.get(spec.gpu)
            if pinned is None:
                raise PlacementError(
                    f"stream {spec.id!r} asks for gpu {spec.gpu}, but this server runs on "
                    f"GPU(s) {list(gpus)}"
                )
        previous = {
            sid: position[self._workers[s.worker].gpu]  # type: ignore[index]
            for sid, s in self._streams.items()
        }
        per_gpu = self._plan.gpus.count(gpus[0]) * self._plan.streams_per_process
        cap = self._settings.gpu.max_streams_per_gpu
        demands = [SourceDemand(sid) for sid in previous] + [SourceDemand(spec.id, pinned)]
        placed = assign(
            demands,
            len(gpus),
            previous=previous,
            max_streams_per_gpu=per_gpu if cap is None else min(cap, per_gpu),
        )
        return placed[spec.id]

    def _on_result(self, message: Published) -> None:
        # Called for every frame of every worker: a dict read, no lock of ours, and nothing
        # unpickled beyond the message's own fields.
        stream = self._streams.get(message.source_id)
        if stream is None or stream.handle != message.handle or stream.removing:
            return  # removed (or replaced) while this result was on its way
        self._hub.publish_encoded(message.source_id, message.frame_index, message.encoded_tail)
        self._metrics.observe(message.observed)

    # --- processes -------------------------------------------------------------------------

    def _supervise(self) -> None:
        """Starts worker processes (every start happens on this thread), puts a ready spare in
        place of a worker that died, and restarts those that die, until close()."""
        waiting: list[tuple[float, _Worker]] = []
        while not self._closed:
            while True:
                try:
                    waiting.append((time.monotonic(), self._spawn_requests.get_nowait()))
                except queue.Empty:
                    break
            now = time.monotonic()
            due = [w for at, w in waiting if at <= now]
            waiting = [(at, w) for at, w in waiting if at > now]
            for slot in due:
                self._fill(slot)
            running = {
                p.process.sentinel: p
                for p in (w.current for w in self._slots)
                if p is not None and not p.reaped
            }
            for sentinel in multiprocessing.connection.wait(
                list(running), timeout=_SUPERVISOR_TICK_S
            ):
                proc = running[sentinel]  # type: ignore[index]
                slot = proc.slot
                delay = self._on_exit(proc)
                if delay is not None:
                    waiting.append((time.monotonic() + delay, slot))

    def _fill(self, slot: _Worker) -> None:
        """Give `slot` a process: a ready spare of its GPU when a worker is being restarted,
        else a new one."""
        current = slot.current
        if current is not None and not current.reaped:
            return  # it has one already (a second request for the same slot)
        if slot.role == "worker" and current is not None:
            spare = self._ready_spare(slot.gpu)
            if spare is not None:
                self._promote(spare, slot)
                return
        self._spawn(slot)

    def _ready_spare(self, gpu: int | None) -> _Worker | None:
        for spare in self._spares:
            proc = spare.current
            if spare.gpu == gpu and proc is not None and proc.alive and not proc.reaped:
                return spare
        return None

    def _promote(self, spare: _Worker, worker: _Worker) -> None:
        """Move `spare`'s ready process into `worker`'s slot and re-add the worker's streams
        there; a new spare is started once they run again."""
        with self._lock:
            proc = spare.current
            assert proc is not None
            spare.current = None
            spare.ready.clear()
            proc.slot = worker
            worker.current, worker.since, worker.start_error = proc, time.monotonic(), None
            worker.ready.set()
            self._metrics.set_worker_up(spare.name, spare.gpu_label, False)
            self._metrics.set_worker_up(worker.name, worker.gpu_label, True)
        log.info(
            "spare %s (pid %s) takes the place of worker %s", spare.name, proc.pid, worker.name
        )
        proc.call_async(Rename(worker.name))  # so its log lines name the slot it serves
        threading.Thread(
            target=self._readd, args=(worker, proc, spare), name="vdet-readd", daemon=True
        ).start()

    def _spawn(self, slot: _Worker) -> None:
        if self._closed:
            return
        ctx = multiprocessing.get_context("spawn")
        ours, theirs = ctx.Pipe(duplex=True)
        env: dict[str, str] = {}
        settings = self._settings.model_copy(update={"sources": []})
        if slot.gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = child_visible_devices(
                slot.gpu, os.environ.get("CUDA_VISIBLE_DEVICES")
            )
            gpu_settings = settings.gpu.model_copy(update={"devices": [0]})
            settings = settings.model_copy(update={"gpu": gpu_settings})
            if self._mps is not None:
                env.update(self._mps.env)
        config = child.WorkerConfig(
            name=slot.name,
            parent_pid=os.getpid(),
            settings=settings,
            max_streams=self._plan.streams_per_process,
            env=env,
            assemble=self._assemble,
            cpu_threads=self._plan.cpu_threads,
        )
        process = ctx.Process(
            target=child.main, args=(config, theirs), name=f"vdet-worker-{slot.name}", daemon=True
        )
        slot.ready.clear()
        slot.start_error = None
        try:
            process.start()
        except Exception as exc:
            slot.start_error = f"{type(exc).__name__}: {exc}"
            slot.ready.set()
            log.error("worker %s could not be started: %s", slot.name, exc)
            return
        finally:
            theirs.close()
        channel = Channel(ours)
        proc = _Process(process, channel, slot)
        with self._lock:
            slot.current, slot.since = proc, time.monotonic()
        self._inbox.add(
            channel,
            lambda message: self._on_message(proc, message),
            lambda: self._on_pipe_closed(proc),
        )
        log.info("worker %s started (pid %s, gpu %s)", slot.name, process.pid, slot.gpu_label)

    def _on_message(self, proc: _Process, message: object) -> None:
        """One message from `proc`'s pipe, on the inbox's thread."""
        if isinstance(message, PublishedBatch):
            for result in message.results:
                self._on_result(result)
        elif isinstance(message, Reply):
            proc.reply(message)
        elif isinstance(message, Ready):
            self._on_ready(proc, message)
        elif isinstance(message, Fatal):
            with self._lock:
                proc.slot.start_error = message.error
                proc.slot.ready.set()

    def _on_pipe_closed(self, proc: _Process) -> None:
        """`proc`'s pipe has closed: its process has ended or is ending."""
        proc.alive = False
        # Only the supervisor reaps a process (two threads reaping one race, and the loser
        # sees it as still running): here it is only waited for, to name how it ended.
        multiprocessing.connection.wait([proc.process.sentinel], timeout=1.0)
        proc.fail_pending(f"worker {proc.slot.name} has exited")
        with self._lock:
            if proc.slot.current is proc:  # not a slot that has a newer process already
                proc.slot.ready.set()
        proc.channel.close()

    def _on_ready(self, proc: _Process, message: Ready) -> None:
        with self._lock:
            if proc.reaped:  # a Ready still in the pipe of a process that has died since
                return
            proc.info = message
            proc.alive = True
            slot = proc.slot
            self._metrics.set_worker_up(slot.name, slot.gpu_label, True)
            slot.ready.set()
        log.info("worker %s ready: %s", slot.name, message.description)
        if slot.role == "worker" and slot.restarts:
            threading.Thread(
                target=self._readd, args=(slot, proc, None), name="vdet-readd", daemon=True
            ).start()

    def _on_exit(self, proc: _Process) -> float | None:
        """A worker's process has ended: fail its streams and say when to fill its slot again
        (seconds from now), or None when it is not restarted."""
        worker = proc.slot  # only this thread moves a process between slots
        proc.reaped = True  # each process is handled once
        proc.process.join(5.0)
        proc.alive = False
        reason = f"worker {worker.name} {_describe_exit(proc.process.exitcode)}"
        if worker.start_error is not None:
            reason += f": {redact(worker.start_error)}"
        worker.last_exit = reason
        proc.fail_pending(reason)
        self._metrics.set_worker_up(worker.name, worker.gpu_label, False)
        with self._lock:
            closing = self._closed
            owned = [
                s
                for s in self._streams.values()
                if worker.role == "worker" and s.worker == worker.index
            ]
            for stream in owned:
                stream.failed = f"{reason}; restarting it" if self._restarts else reason
        for stream in owned:
            self._metrics.set_source_state(stream.spec.id, SourceState.FAILED)
        if closing:
            return None
        log.error("%s (%d stream(s) affected)", reason, len(owned))
        if not self._restarts:
            return None
        lived = time.monotonic() - worker.since
        worker.quick_deaths = worker.quick_deaths + 1 if lived < _QUICK_DEATH_S else 0
        worker.restarts += 1
        self._metrics.count_worker_restart(worker.name, worker.gpu_label)
        pauses = worker.quick_deaths
        if worker.role == "worker" and self._ready_spare(worker.gpu) is not None:
            # A spare starts no process: it waits only when the slot keeps dying (its
            # streams may be what kills it), so spares are not used up in a loop.
            pauses = max(0, pauses - 1)
        return _RESTART_BACKOFF_S[min(pauses, len(_RESTART_BACKOFF_S) - 1)]

    @property
    def _restarts(self) -> bool:
        return self._settings.workers.restart

    def _readd(self, worker: _Worker, proc: _Process, spare: _Worker | None) -> None:
        """Add a restarted worker's streams to its new process `proc`, as they were, all at
        once; then, when `proc` was `spare`'s, start a new spare. (Not before: on a small
        machine a spare loading its model would slow the streams that wait to run again.)"""
        try:
            with self._lock:
                # Only streams the death failed (or an earlier re-add): one added through the
                # API since `proc` took the slot runs there already.
                owned = [
                    s
                    for s in self._streams.values()
                    if s.worker == worker.index and not s.removing and s.failed is not None
                ]
            # Calls go to `proc`, never to whatever process serves the slot by the time they
            # are sent: a newer process gets its own re-add.
            asked = [(s, proc.call_async(AddStream(s.spec, s.handle))) for s in owned]
            for stream, future in asked:
                try:
                    future.result(self._call_timeout)
                except Exception as exc:
                    error = redact(str(exc)) or type(exc).__name__
                    with self._lock:
                        stream.failed = f"{worker.last_exit}; adding it again failed: {error}"
                    log.error(
                        "stream %s: adding it to restarted %s failed: %s",
                        stream.spec.id,
                        worker.name,
                        error,
                    )
                    continue
                self._metrics.restart_source(stream.spec.id)
                with self._lock:
                    if proc.alive and worker.current is proc:
                        stream.failed = None
                log.info("stream %s runs again in worker %s", stream.spec.id, worker.name)
        finally:
            if spare is not None:
                self._spawn_requests.put(spare)


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "stopped answering"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


__all__ = ["WorkerPool", "WorkerUnavailableError", "WorkerView"]
