"""The API process's side of the stream worker processes: start, supervise, route, collect.

`WorkerPool` is the `StreamService` (vdet.runtime) of a `vdet serve` whose streams run in worker
processes (vdet.workers.plan says how many, and on which GPU). It
- starts every worker with `spawn`, always from its one long-lived supervisor thread: Linux
  sends a worker its parent-death signal when the *thread* that started it ends, so no
  short-lived thread may start one;
- places a new stream: its GPU by the node's rules (pinned, sticky, least loaded:
  vdet.placement), then the least-loaded worker of that GPU with room. A stream never moves;
- sends each control call to the worker that owns the stream and waits for its reply, up to
  `workers.call_timeout_s` (then WorkerUnavailableError, which the API answers with 503);
- reads each worker's pipe on a thread of its own: results are numbered by the one results hub
  here (a single seq across processes, so WebSocket resume works as before) and recorded in
  the one metrics registry; replies complete their calls;
- notices a worker that dies (its process sentinel, within a fraction of a second), shows its
  streams `failed` with the reason, starts a new process in its place and adds the same
  streams there (same ids and settings). The other workers' streams never notice.

It runs no frame work and holds no frames: results arrive ready, snapshots arrive as JPEG.
"""

from __future__ import annotations

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
from typing import Any

from vdet.api.frames import EncodedFrame
from vdet.config import DetectionDefaults, Settings, StreamSpec
from vdet.hub import ResultsHub
from vdet.ingest.urls import redact, validate_source_url
from vdet.metrics import Metrics
from vdet.pipeline.postprocess import PostprocessParams
from vdet.placement import PlacementError, SourceDemand, assign
from vdet.runtime import BackendInfo, Health
from vdet.streams import (
    DuplicateStreamError,
    LimitError,
    StreamError,
    StreamView,
    UnknownStreamError,
    resolve_params,
)
from vdet.types import (
    DetectionResult,
    Detections,
    ImageArray,
    SourceState,
    SourceStatus,
    StageTimings,
)
from vdet.workers import child
from vdet.workers.channel import Call, Channel, Fatal, Published, Ready, Reply, Stop
from vdet.workers.mps import MpsDaemon, start_mps
from vdet.workers.plan import WorkerPlan, child_visible_devices

log = logging.getLogger(__name__)

# A worker that died this soon after starting is restarted after a growing pause, so a model
# that cannot load does not become a tight loop of process starts.
_QUICK_DEATH_S = 30.0
_RESTART_BACKOFF_S = (0.0, 1.0, 2.0, 5.0, 10.0, 30.0)
_SUPERVISOR_TICK_S = 0.2
_STOP_GRACE_S = 6.0
# How long a /metrics scrape waits for the workers' counts.
_SCRAPE_WAIT_S = 2.0


class WorkerUnavailableError(StreamError):
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


@dataclasses.dataclass(frozen=True)
class WorkerView:
    """One worker process, for `GET /v1/workers` and logs."""

    name: str
    gpu: str
    pid: int | None
    alive: bool
    streams: int
    restarts: int
    last_exit: str | None


class _Worker:
    """One worker position. Its process is replaced when it dies; calls go to the current one."""

    def __init__(self, index: int, gpu: int | None) -> None:
        self.index = index
        self.gpu = gpu
        self.name = f"w{index}"
        self.gpu_label = "cpu" if gpu is None else str(gpu)
        self.process: multiprocessing.process.BaseProcess | None = None
        self.reaped: multiprocessing.process.BaseProcess | None = None  # handled by _on_exit
        self.channel: Channel | None = None
        self.started_at = 0.0
        self.alive = False
        self.info: Ready | None = None
        self.start_error: str | None = None
        self.ready = threading.Event()
        self.restarts = 0
        self.quick_deaths = 0
        self.last_exit: str | None = None
        self._lock = threading.Lock()
        self._pending: dict[int, Future[Any]] = {}
        self._ids = itertools.count(1)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def call_async(self, method: str, *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        with self._lock:
            channel = self.channel
            if not self.alive or channel is None:
                future.set_exception(
                    WorkerUnavailableError(f"worker {self.name} is restarting; retry shortly")
                )
                return future
            call_id = next(self._ids)
            self._pending[call_id] = future
        try:
            channel.send(Call(call_id, method, args))
        except (OSError, ValueError) as exc:
            self._settle(call_id, WorkerUnavailableError(f"worker {self.name} is gone: {exc}"))
        return future

    def call(self, method: str, *args: Any, timeout: float) -> Any:
        future = self.call_async(method, *args)
        try:
            return future.result(timeout)
        except FutureTimeout:
            raise WorkerUnavailableError(
                f"worker {self.name} did not answer {method!r} within {timeout:g} s"
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
            pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(WorkerUnavailableError(reason))


class WorkerPool:
    """The streams of this service, run by worker processes (module docstring)."""

    def __init__(self, settings: Settings, plan: WorkerPlan, hub: ResultsHub, metrics: Metrics):
        if plan.processes < 1:
            raise ValueError("a WorkerPool needs at least one worker process")
        self._settings = settings
        self._plan = plan
        self._hub = hub
        self._metrics = metrics
        self._workers = tuple(_Worker(i, gpu) for i, gpu in enumerate(plan.gpus))
        self._lock = threading.Lock()  # guards _streams and _closed
        self._streams: dict[str, _RemoteStream] = {}
        self._handles = itertools.count(1)
        self._closed = False
        self._mps: MpsDaemon | None = None
        self.mps_active = False
        self._round_robin = itertools.count()
        self._spawn_requests: queue.SimpleQueue[_Worker] = queue.SimpleQueue()
        self._supervisor = threading.Thread(
            target=self._supervise, name="vdet-worker-supervisor", daemon=True
        )
        self.backend_info: BackendInfo = BackendInfo("", "", "", "", ())

    @classmethod
    def start(
        cls, settings: Settings, plan: WorkerPlan, hub: ResultsHub, metrics: Metrics
    ) -> WorkerPool:
        """Start every worker and wait until each has loaded its model; RuntimeError naming the
        worker and its error if one cannot."""
        pool = cls(settings, plan, hub, metrics)
        try:
            pool._mps = start_mps(settings.gpu.mps, plan.shared_gpus())
            pool.mps_active = pool._mps is not None and pool._mps.active
            metrics.mps_active.set(1.0 if pool.mps_active else 0.0)
            pool._supervisor.start()
            for worker in pool._workers:
                pool._spawn_requests.put(worker)
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
        pool.backend_info = first.backend
        return pool

    # --- StreamService ----------------------------------------------------------------------

    @property
    def class_names(self) -> tuple[str, ...]:
        return self.backend_info.class_names

    @property
    def defaults(self) -> DetectionDefaults:
        return self._settings.detection

    def add(self, spec: StreamSpec) -> StreamView:
        # Checked here as well as in the worker, so a bad stream costs no round trip and a
        # source the policy refuses never reaches a worker process (ValueError: 422).
        validate_source_url(spec.url, self._settings.ingest.source_policy.policy())
        resolve_params(self.defaults, self.class_names, classes=spec.classes)
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
            view = worker.call("add", spec, stream.handle, timeout=self._call_timeout)
        except WorkerUnavailableError:
            # It may still have added the stream: make sure nothing of it is left running.
            worker.call_async("remove", spec.id)
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
            index: self._workers[index].call_async("list")
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
            view = worker.call("get", stream_id, timeout=self._call_timeout)
        except WorkerUnavailableError as exc:  # it died a moment ago: say so, as list() does
            return self._failed_view(stream, worker, str(exc))
        return self._tag(view, worker)

    def update_params(self, stream_id: str, **changes: Any) -> StreamView:
        stream = self._stream(stream_id)
        worker = self._workers[stream.worker]
        view: StreamView = worker.call(
            "update_params", stream_id, changes, timeout=self._call_timeout
        )
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
                    worker.call("remove", stream_id, timeout=self._call_timeout)
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

    def latest_jpeg(
        self,
        stream_id: str,
        *,
        boxes: bool = True,
        quality: int = 85,
        max_width: int | None = None,
        newer_than: int = 0,
    ) -> EncodedFrame | None:
        stream = self._stream(stream_id)
        latest = self._hub.latest(stream_id)
        if stream.failed is not None or latest is None or latest.seq <= newer_than:
            return None  # nothing newer: known here, without asking the worker
        worker = self._workers[stream.worker]
        # Results carry no seq in a worker (the hub numbers them here): any frame will do.
        options = {"boxes": boxes, "quality": quality, "max_width": max_width, "newer_than": -1}
        frame: EncodedFrame | None = worker.call(
            "latest_jpeg", stream_id, options, timeout=self._call_timeout
        )
        if frame is None:
            return None
        # The worker does not know the seq the hub gave the frame's result (that result may
        # still be on its way here): look it up by the frame's index.
        numbered = self._hub.find(stream_id, frame.frame_index, wait_s=0.1)
        if numbered is None:
            return None if newer_than else dataclasses.replace(frame, seq=latest.seq)
        if numbered.seq <= newer_than:
            return None
        return dataclasses.replace(frame, seq=numbered.seq)

    def detect(
        self, image_bgr: ImageArray, params: PostprocessParams
    ) -> tuple[Detections, StageTimings]:
        alive = [w for w in self._workers if w.alive]
        if not alive:
            raise WorkerUnavailableError("no worker process is running; retry shortly")
        worker = alive[next(self._round_robin) % len(alive)]
        result: tuple[Detections, StageTimings] = worker.call(
            "detect", image_bgr, params, timeout=self._call_timeout
        )
        return result

    def sync_metrics(self) -> None:
        """Fold every worker's stream counters into the metrics. A worker that does not answer
        within `_SCRAPE_WAIT_S` (busy starting streams, say) keeps its last values: a scrape
        must not wait for it."""
        asked = [(w, w.call_async("health")) for w in self._workers if w.alive]
        deadline = time.monotonic() + _SCRAPE_WAIT_S
        gpu_streams: dict[str, int] = collections.defaultdict(int)
        gpu_memory: dict[str, int] = collections.defaultdict(int)
        now = time.time()
        for worker in self._workers:
            self._metrics.set_worker_up(worker.name, worker.gpu_label, worker.alive)
            gpu_streams[worker.gpu_label] += 0
        for worker, future in asked:
            try:
                health: Health = future.result(max(0.0, deadline - time.monotonic()))
            except (FutureTimeout, WorkerUnavailableError):
                log.warning("worker %s did not report its streams in time", worker.name)
                continue
            for source_id, status in health.sources:
                if source_id in self:
                    self._metrics.sync_source(source_id, status, now=now)
                    self._metrics.set_source_state(source_id, status.state)
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
        b = self.backend_info
        return f"{b.backend} on {b.device} in {len(self._workers)} worker processes{per_gpu}{mps}"

    def workers(self) -> builtins.list[WorkerView]:
        with self._lock:
            load = collections.Counter(s.worker for s in self._streams.values())
        return [
            WorkerView(
                name=w.name,
                gpu=w.gpu_label,
                pid=w.pid,
                alive=w.alive,
                streams=load[w.index],
                restarts=w.restarts,
                last_exit=w.last_exit,
            )
            for w in self._workers
        ]

    def close(self) -> None:
        """Stop every worker (each stops its streams), waiting up to a few seconds before
        terminating those that do not exit; then the MPS daemon this pool started. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        # The supervisor stops first: two threads reaping one process would race.
        if self._supervisor.is_alive():
            self._supervisor.join(5.0)
        for worker in self._workers:
            if worker.channel is not None:
                with contextlib.suppress(OSError, ValueError):  # already gone
                    worker.channel.send(Stop())
        deadline = time.monotonic() + _STOP_GRACE_S
        for worker in self._workers:
            process = worker.process
            if process is not None:
                process.join(max(0.0, deadline - time.monotonic()))
        for worker in self._workers:
            process = worker.process
            if process is not None and process.is_alive():
                log.warning("worker %s did not stop in time; terminating it", worker.name)
                process.terminate()
                process.join(2.0)
                if process.is_alive():
                    process.kill()
                    process.join(1.0)
            worker.alive = False
            worker.fail_pending("the service is shutting down")
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
        params = resolve_params(
            self.defaults,
            self.class_names,
            conf_threshold=stream.spec.conf_threshold,
            iou_threshold=stream.spec.iou_threshold,
            max_det=stream.spec.max_det,
            classes=stream.spec.classes,
        )
        status = SourceStatus(state=SourceState.FAILED, last_error=reason)
        return StreamView(
            spec=stream.spec,
            params=params,
            status=status,
            frames_processed=0,
            last_frame_age_s=None,
            pipeline_error=None,
            worker=worker.name,
        )

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
            raise LimitError(
                f"every running worker process{where} already has {per_process} stream(s) "
                f"(workers.streams_per_process) or is restarting; delete a stream or start "
                f"more worker processes (workers.processes)"
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

    def _on_result(self, handle: int, result: DetectionResult) -> None:
        # Called for every frame of every worker: a dict read, no lock of ours.
        stream = self._streams.get(result.source_id)
        if stream is None or stream.handle != handle or stream.removing:
            return  # removed (or replaced) while this result was on its way
        numbered = self._hub.publish(result)
        self._metrics.observe_result(numbered)

    # --- processes -------------------------------------------------------------------------

    def _supervise(self) -> None:
        """Starts worker processes (every start happens on this thread) and restarts those
        that die, until close()."""
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
            for worker in due:
                self._spawn(worker)
            running = {
                w.process.sentinel: w
                for w in self._workers
                if w.process is not None and w.process is not w.reaped
            }
            for sentinel in multiprocessing.connection.wait(
                list(running), timeout=_SUPERVISOR_TICK_S
            ):
                worker = running[sentinel]  # type: ignore[index]
                delay = self._on_exit(worker)
                if delay is not None:
                    waiting.append((time.monotonic() + delay, worker))

    def _spawn(self, worker: _Worker) -> None:
        if self._closed:
            return
        ctx = multiprocessing.get_context("spawn")
        ours, theirs = ctx.Pipe(duplex=True)
        env: dict[str, str] = {}
        settings = self._settings.model_copy(update={"sources": []})
        if worker.gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = child_visible_devices(
                worker.gpu, os.environ.get("CUDA_VISIBLE_DEVICES")
            )
            gpu_settings = settings.gpu.model_copy(update={"devices": [0]})
            settings = settings.model_copy(update={"gpu": gpu_settings})
            if self._mps is not None:
                env.update(self._mps.env)
        config = child.WorkerConfig(
            name=worker.name,
            parent_pid=os.getpid(),
            settings=settings,
            max_streams=self._plan.streams_per_process,
            env=env,
            cpu_threads=self._plan.cpu_threads,
        )
        process = ctx.Process(
            target=child.main, args=(config, theirs), name=f"vdet-worker-{worker.name}", daemon=True
        )
        worker.ready.clear()
        worker.info, worker.start_error = None, None
        try:
            process.start()
        except Exception as exc:
            worker.start_error = f"{type(exc).__name__}: {exc}"
            worker.ready.set()
            log.error("worker %s could not be started: %s", worker.name, exc)
            return
        finally:
            theirs.close()
        channel = Channel(ours)
        worker.process, worker.channel, worker.started_at = process, channel, time.monotonic()
        threading.Thread(
            target=self._read,
            args=(worker, channel),
            name=f"vdet-{worker.name}-reader",
            daemon=True,
        ).start()
        log.info("worker %s started (pid %s, gpu %s)", worker.name, process.pid, worker.gpu_label)

    def _read(self, worker: _Worker, channel: Channel) -> None:
        """One worker process's messages, until its pipe closes."""
        try:
            while True:
                message = channel.recv()
                if isinstance(message, Published):
                    try:
                        self._on_result(message.handle, message.result)
                    except Exception:  # one bad result must not stop this worker's results
                        log.exception("publishing a result of %s failed", message.result.source_id)
                elif isinstance(message, Reply):
                    worker.reply(message)
                elif isinstance(message, Ready):
                    worker.info = message
                    worker.alive = True
                    self._metrics.set_worker_up(worker.name, worker.gpu_label, True)
                    worker.ready.set()
                    log.info("worker %s ready: %s", worker.name, message.description)
                    if worker.restarts:
                        threading.Thread(
                            target=self._readd, args=(worker,), name="vdet-readd", daemon=True
                        ).start()
                elif isinstance(message, Fatal):
                    worker.start_error = message.error
                    worker.ready.set()
        except (EOFError, OSError):
            pass
        finally:
            worker.alive = False
            # Only the supervisor reaps a process (two threads reaping one race, and the loser
            # sees it as still running): here it is only waited for, to name how it ended.
            process = worker.process
            if process is not None:
                multiprocessing.connection.wait([process.sentinel], timeout=1.0)
            worker.fail_pending(f"worker {worker.name} has exited")
            worker.ready.set()
            channel.close()

    def _on_exit(self, worker: _Worker) -> float | None:
        """A worker's process has ended: fail its streams and say when to start it again
        (seconds from now), or None when it is not restarted."""
        process = worker.process
        assert process is not None
        worker.reaped = process  # each process is handled once
        process.join(5.0)
        worker.alive = False
        reason = f"worker {worker.name} {_describe_exit(process.exitcode)}"
        if worker.start_error is not None:
            reason += f": {redact(worker.start_error)}"
        worker.last_exit = reason
        worker.fail_pending(reason)
        self._metrics.set_worker_up(worker.name, worker.gpu_label, False)
        with self._lock:
            closing = self._closed
            owned = [s for s in self._streams.values() if s.worker == worker.index]
            for stream in owned:
                stream.failed = f"{reason}; restarting it" if self._restarts else reason
        for stream in owned:
            self._metrics.set_source_state(stream.spec.id, SourceState.FAILED)
        if closing:
            return None
        log.error("%s (%d stream(s) affected)", reason, len(owned))
        if not self._restarts:
            return None
        lived = time.monotonic() - worker.started_at
        worker.quick_deaths = worker.quick_deaths + 1 if lived < _QUICK_DEATH_S else 0
        worker.restarts += 1
        self._metrics.count_worker_restart(worker.name, worker.gpu_label)
        return _RESTART_BACKOFF_S[min(worker.quick_deaths, len(_RESTART_BACKOFF_S) - 1)]

    @property
    def _restarts(self) -> bool:
        return self._settings.workers.restart

    def _readd(self, worker: _Worker) -> None:
        """Add a restarted worker's streams to its new process, as they were."""
        with self._lock:
            owned = [
                s for s in self._streams.values() if s.worker == worker.index and not s.removing
            ]
        for stream in owned:
            try:
                worker.call("add", stream.spec, stream.handle, timeout=self._call_timeout)
            except Exception as exc:
                error = redact(str(exc))
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
                stream.failed = None
            log.info("stream %s runs again in worker %s", stream.spec.id, worker.name)


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
