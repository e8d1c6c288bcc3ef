"""Per-source GPU-resident detection: NV12 frame -> detections with one CUDA graph replay.

This module owns running the whole per-frame pipeline on the GPU for a source: the source's own
CUDA stream, its static input buffers, and, per frame shape, ONE captured CUDA graph of
preprocess -> network -> decode + NMS -> async copy of the compact result ([max_det, 6] rows and
a count) into pinned host memory. A frame costs a device-to-device copy into the static input,
one `replay()` (a few microseconds of host time instead of hundreds of kernel launches), and one
event wait. Graphs are cached per (geometry, params) in a small LRU, so a source that changes
resolution, or whose thresholds change, is recaptured once. When capture fails the same work
runs eagerly: `on_eager_fallback` is called for every such frame (the service counts it in
vdet_inference_eager_fallbacks_total) and the first failure is logged.

`BatchedGraphRunner` is the throughput variant: up to K ready frames of any sources are
preprocessed into one static batch and a single batch-K graph runs network + NMS + copy.

The ops come from outside (`PreprocessFn`, `DecodeNmsFn` from gpu_ops or the CUDA kernels of
vdet.cuda), and so does the network: this module must not load models, decode video or know
which thread calls it (each runner serialises its own calls).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import numpy as np
import torch

from vdet.core.types import ColourMatrix, ColourRange, Detections, FloatArray
from vdet.cuda.capture_guard import CUDA_WORK
from vdet.cuda.cuda_stream import on_stream
from vdet.gpu.frame_ops import (
    DETECTION_COLUMNS,
    DecodeNmsFn,
    Nv12Geometry,
    PreprocessFn,
    ReferenceDecodeNms,
    nv12_letterbox_reference,
    rows_to_arrays,
)
from vdet.inference.postprocess import PostprocessParams, decode_and_nms_image

log = logging.getLogger(__name__)

Network = Callable[[torch.Tensor], torch.Tensor]
KeyT = TypeVar("KeyT", bound=Hashable)
ValueT = TypeVar("ValueT")


class Replayable(Protocol):
    """What a capture returns: torch.cuda.CUDAGraph is one."""

    def replay(self) -> None: ...


# capture(work, stream) -> a replayable graph of `work`, or an exception when it cannot.
CaptureFn = Callable[[Callable[[], None], "torch.cuda.Stream | None"], Replayable]


def capture_cuda_graph(work: Callable[[], None], stream: torch.cuda.Stream | None) -> Replayable:
    """Capture `work` into a torch.cuda.CUDAGraph on `stream` (thread-local capture errors).

    thread_local: other sources' threads keep launching and allocating while one captures;
    only this thread's unsafe calls may invalidate this capture.
    """
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
        work()
    return graph


def graph_launcher(graph: Replayable, stream: torch.cuda.Stream | None) -> Callable[[], None]:
    """The cheapest way to launch a captured graph on `stream`, as a call.

    A torch graph's executable graph goes straight to `cuGraphLaunch` (one driver call, a few
    microseconds): `replay()` needs its stream made current first, and making a torch stream
    current and back costs more host time than the launch itself. Anything else (graphs from an
    injected capture, no cuda-python) is replayed with the stream current.
    """
    raw_exec = getattr(graph, "raw_cuda_graph_exec", None)
    if stream is not None and raw_exec is not None:
        try:
            from cuda.bindings import driver

            from vdet.cuda.launch import check

            executable = driver.CUgraphExec(int(raw_exec()))
            handle = driver.CUstream(int(stream.cuda_stream))
        except (ImportError, RuntimeError, TypeError, ValueError) as exc:
            log.debug("graph launch through replay(): %s", exc)
        else:

            def launch() -> None:
                check(driver.cuGraphLaunch(executable, handle), "cuGraphLaunch")

            return launch

    def replay() -> None:
        with on_stream(stream):
            graph.replay()

    return replay


class GraphCache(Generic[KeyT, ValueT]):
    """A small LRU: the most recently used `capacity` entries; `on_evict` gets each one dropped."""

    def __init__(self, capacity: int, on_evict: Callable[[ValueT], None] | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self._on_evict = on_evict
        self._entries: OrderedDict[KeyT, ValueT] = OrderedDict()

    def get(self, key: KeyT) -> ValueT | None:
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def put(self, key: KeyT, value: ValueT) -> None:
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            _, dropped = self._entries.popitem(last=False)
            if self._on_evict is not None:
                self._on_evict(dropped)

    def keys(self) -> list[KeyT]:
        """Least recently used first."""
        return list(self._entries)

    def clear(self) -> None:
        while self._entries:
            _, dropped = self._entries.popitem(last=False)
            if self._on_evict is not None:
                self._on_evict(dropped)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries


class Nv12Frame(Protocol):
    """What `run_frame` reads from a decoded frame (vdet.ingest.nvdec.GpuVideoFrame is one)."""

    @property
    def nv12(self) -> torch.Tensor: ...

    @property
    def size_wh(self) -> tuple[int, int]: ...

    @property
    def matrix(self) -> ColourMatrix: ...

    @property
    def colour_range(self) -> ColourRange: ...

    @property
    def bits(self) -> int: ...

    @property
    def ready(self) -> torch.cuda.Event | None: ...


@dataclass(frozen=True)
class RunResult:
    """Detections in source pixels for one frame, and how they were computed.

    `seconds` is the wall time of the call (copy, replay or eager launches, and the wait);
    `launch_seconds` the host time spent enqueuing the frame's GPU work (one replay, or every
    kernel launch when eager); `replayed` is False when the frame ran eagerly (capture failed
    or graphs are off).
    """

    detections: Detections
    seconds: float
    replayed: bool
    launch_seconds: float = 0.0


@dataclass
class _Slot:
    """The static buffers and, once captured, the graph of one (geometry, params) key."""

    geometry: Nv12Geometry | None  # None for the batched runner (preprocess outside the graph)
    params: PostprocessParams
    nv12: torch.Tensor | None
    net_in: torch.Tensor
    boxes: torch.Tensor
    count: torch.Tensor
    host_boxes: torch.Tensor
    host_count: torch.Tensor
    raw: torch.Tensor | None = None
    network: Network | None = None  # the runner's own when None (a batch bucket's otherwise)
    graph: Replayable | None = None
    launch: Callable[[], None] | None = None  # graph_launcher(graph, stream)
    copies_in_graph: bool = False
    eager: bool = False
    failure: str | None = None


def _parse_rows(
    count: int,
    rows: FloatArray,
    head: FloatArray | None,
    params: PostprocessParams,
    geometry: Nv12Geometry,
) -> Detections:
    """One image's detections in source pixels from decode + NMS's `count` and [max_det, 6]
    `rows`; a negative count (decode + NMS could not prove its result within its fixed work)
    decodes the network's raw `head` with the host reference instead."""
    if count < 0:
        assert head is not None
        dets = decode_and_nms_image(head, params)[0]
    else:
        xyxy, scores, class_ids = rows_to_arrays(rows, count)
        dets = Detections(xyxy, scores, class_ids)
    return Detections(geometry.transform.to_source(dets.xyxy), dets.scores, dets.class_ids)


@dataclass(frozen=True)
class RunnerOptions:
    """How a runner runs, whatever its network, input shape and batch: what a GPU device
    gives every runner it makes.

    `dtype`, `device` and `channels_last` describe the network's input; `preprocess` /
    `decode_nms` default to the torch references in gpu_ops; `use_graphs` False runs the work
    eagerly; `cache_size` is the LRU of graphs per runner (per batch bucket when batched);
    `on_eager_fallback` is called for every frame that ran eagerly because capture failed;
    `capture` replaces CUDA graph capture (tests inject a failing or fake one);
    `blocking_wait`: the thread waiting for a frame's result sleeps until the GPU signals
    (cudaEventBlockingSync) instead of spinning on a core (vdet.cuda.host_wait).
    """

    dtype: torch.dtype = torch.float16
    device: torch.device | str = "cuda"
    preprocess: PreprocessFn | None = None
    decode_nms: DecodeNmsFn | None = None
    channels_last: bool = True
    use_graphs: bool = True
    cache_size: int = 4
    on_eager_fallback: Callable[[], None] | None = None
    capture: CaptureFn | None = None
    blocking_wait: bool = False


class _RunnerBase:
    """Shared machinery: device, stream, capture with fallbacks, host buffers, result parsing."""

    def __init__(
        self,
        network: Network,
        *,
        input_hw: tuple[int, int],
        batch: int,
        options: RunnerOptions,
        cache_size: int,
        name: str,
    ) -> None:
        dtype, device, capture = options.dtype, options.device, options.capture
        preprocess, decode_nms = options.preprocess, options.decode_nms
        self.options = options
        self.network = network
        self.input_hw = (int(input_hw[0]), int(input_hw[1]))
        self.batch = batch
        self.dtype = dtype
        self.device = torch.device(device)
        self.channels_last = options.channels_last
        self.name = name
        self.preprocess: PreprocessFn = (
            preprocess if preprocess is not None else nv12_letterbox_reference
        )
        self._reference_nms = ReferenceDecodeNms()
        self.decode_nms: DecodeNmsFn = decode_nms if decode_nms is not None else self._reference_nms
        self._cuda = self.device.type == "cuda"
        self.use_graphs = options.use_graphs and (self._cuda or capture is not None)
        self._capture: CaptureFn = capture if capture is not None else capture_cuda_graph
        self._on_eager_fallback = options.on_eager_fallback
        self.stream: torch.cuda.Stream | None = (
            torch.cuda.Stream(device=self.device) if self._cuda else None  # type: ignore[no-untyped-call]
        )
        # blocking_wait: the thread waiting for a frame's result sleeps until the GPU signals
        # (cudaEventBlockingSync) instead of spinning on a core (vdet.cuda.host_wait).
        self._done = (
            torch.cuda.Event(blocking=options.blocking_wait)  # type: ignore[no-untyped-call]
            if self._cuda
            else None
        )
        self._lock = threading.Lock()
        self._logged_failure = False
        self.eager_runs = 0
        self.captures = 0
        self._slots: GraphCache[Hashable, _Slot] = GraphCache(cache_size, self._release)

    # -- buffers ---------------------------------------------------------------------------

    def _host(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        return torch.zeros(shape, dtype=dtype, pin_memory=self._cuda)

    def _new_slot(
        self,
        geometry: Nv12Geometry | None,
        params: PostprocessParams,
        nv12: torch.Tensor | None,
        batch: int | None = None,
        network: Network | None = None,
        net_in: torch.Tensor | None = None,
    ) -> _Slot:
        H, W = self.input_hw
        batch = self.batch if batch is None else batch
        with on_stream(self.stream):
            if net_in is None:
                net_in = torch.zeros((batch, 3, H, W), dtype=self.dtype, device=self.device)
            boxes = torch.zeros(
                (batch, params.max_det, DETECTION_COLUMNS),
                dtype=torch.float32,
                device=self.device,
            )
            count = torch.zeros((batch,), dtype=torch.int32, device=self.device)
            static_nv12 = None if nv12 is None else torch.zeros_like(nv12, device=self.device)
        return _Slot(
            geometry=geometry,
            params=params,
            nv12=static_nv12,
            net_in=net_in,
            boxes=boxes,
            count=count,
            host_boxes=self._host(tuple(boxes.shape), torch.float32),
            host_count=self._host(tuple(count.shape), torch.int32),
            network=network,
        )

    @staticmethod
    def _release(slot: _Slot) -> None:
        slot.graph = None  # the graph's private memory pool goes with its last reference
        slot.launch = None
        slot.raw = None

    # -- the captured work -----------------------------------------------------------------

    def _preprocess_into(self, slot: _Slot) -> None:
        """Fill slot.net_in from the slot's static inputs (per-runner; none for batched)."""

    def _work(self, slot: _Slot, copies: bool) -> None:
        with torch.no_grad():
            self._preprocess_into(slot)
            net_in = slot.net_in
            if self.channels_last:
                net_in = net_in.contiguous(memory_format=torch.channels_last)
            network = self.network if slot.network is None else slot.network
            raw = network(net_in)
            slot.raw = raw
            self.decode_nms(raw, slot.params, slot.boxes, slot.count, self.stream)
            if copies:
                self._copy_out(slot)

    def _bound_work(self, slot: _Slot, copies: bool) -> Callable[[], None]:
        return lambda: self._work(slot, copies)

    def _copy_out(self, slot: _Slot) -> None:
        slot.host_boxes.copy_(slot.boxes, non_blocking=self._cuda)
        slot.host_count.copy_(slot.count, non_blocking=self._cuda)

    def _prepare(self, slot: _Slot) -> None:
        """Warm up and capture a new slot; on failure mark it eager (logged once, counted)."""
        with CUDA_WORK.work(), on_stream(self.stream):
            # Warm-up outside capture: cuDNN/cuBLAS choose their kernels and allocate their
            # workspaces, and decode + NMS makes its device constants.
            for _ in range(2 if self._cuda else 1):
                self._work(slot, copies=True)
        if self.stream is not None:
            self.stream.synchronize()
        if not self.use_graphs:
            slot.eager = True
            return
        errors = []
        for copies in (True, False):
            try:
                # Alone in the process (vdet.cuda.capture_guard): one capture at a time, and no
                # decoder or other runner working on the GPU meanwhile.
                with CUDA_WORK.capture():
                    slot.graph = self._capture(self._bound_work(slot, copies), self.stream)
                slot.launch = graph_launcher(slot.graph, self.stream)
                slot.copies_in_graph = copies
                self.captures += 1
                return
            except Exception as exc:  # capture raises many types (RuntimeError, CUDA errors)
                errors.append(f"{type(exc).__name__}: {exc}")
                slot.graph = None
                if self.stream is not None:
                    self.stream.synchronize()
        slot.eager = True
        slot.failure = "; ".join(errors)
        if not self._logged_failure:
            self._logged_failure = True
            log.warning(
                "%s: CUDA graph capture failed, running eagerly from now on for this shape "
                "(counted in vdet_inference_eager_fallbacks_total): %s",
                self.name,
                slot.failure,
            )

    def _execute(self, slot: _Slot) -> tuple[bool, float]:
        """Replay or run the slot's work on the stream, copy results to the host, wait.

        Returns (replayed, host seconds spent enqueuing the work).
        """
        replayed, launch = self._enqueue(slot)
        self._finish()
        return replayed, launch

    def _enqueue(self, slot: _Slot) -> tuple[bool, float]:
        """Replay or run the slot's work and its copy to the host on the stream; no wait."""
        with CUDA_WORK.work():
            started = time.perf_counter()
            if slot.launch is not None and not slot.eager:
                slot.launch()
                launch = time.perf_counter() - started
                if not slot.copies_in_graph:
                    with on_stream(self.stream):
                        self._copy_out(slot)
                replayed = True
            else:
                with on_stream(self.stream):
                    self._work(slot, copies=True)
                launch = time.perf_counter() - started
                replayed = False
                self.eager_runs += 1
        if not replayed and self._on_eager_fallback is not None and self.use_graphs:
            self._on_eager_fallback()
        if self._done is not None and self.stream is not None:
            self._done.record(self.stream)
        return replayed, launch

    def _finish(self) -> None:
        """Wait until the work `_enqueue` put on the stream (and its host copy) is done."""
        if self._done is not None:
            self._done.synchronize()

    def _detections(self, slot: _Slot, index: int, geometry: Nv12Geometry) -> Detections:
        count = int(slot.host_count[index])
        head = self._head(slot, index) if count < 0 else None
        return _parse_rows(count, slot.host_boxes[index].numpy(), head, slot.params, geometry)

    @staticmethod
    def _head(slot: _Slot, index: int) -> FloatArray:
        """The network's raw output for one image, on the host (the decode + NMS fallback)."""
        assert slot.raw is not None
        return np.asarray(slot.raw[index].float().cpu().numpy(), dtype=np.float32)

    def _wait_for(self, nv12: torch.Tensor, ready: torch.cuda.Event | None) -> None:
        """Order this runner's stream after the frame's producer; keep the frame's memory.

        Without a `ready` event the producer is taken to be the caller's current stream.
        """
        if self.stream is None or nv12.device.type != "cuda":
            return
        if ready is not None:
            self.stream.wait_event(ready)
        else:
            self.stream.wait_stream(torch.cuda.current_stream(nv12.device))
        nv12.record_stream(self.stream)

    # -- introspection ---------------------------------------------------------------------

    @property
    def cached_keys(self) -> list[Hashable]:
        """Keys of the captured (or eager) slots, least recently used first."""
        with self._lock:
            return self._slots.keys()

    def close(self) -> None:
        with self._lock:
            self._slots.clear()


class CudaGraphRunner(_RunnerBase):
    """One source's frames -> detections, one CUDA graph per (geometry, params).

    `network` maps (1, 3, H, W) of `options.dtype` -> (1, 4 + nc, N) and must be capturable
    (the torch backend's modules are); `options` says how it runs (`RunnerOptions`).
    Calls are serialised; frames of one source arrive one at a time anyway.
    """

    def __init__(
        self,
        network: Network,
        *,
        input_hw: tuple[int, int],
        options: RunnerOptions = RunnerOptions(),
        name: str = "gpu runner",
    ) -> None:
        super().__init__(
            network,
            input_hw=input_hw,
            batch=1,
            options=options,
            cache_size=options.cache_size,
            name=name,
        )

    def _preprocess_into(self, slot: _Slot) -> None:
        assert slot.nv12 is not None and slot.geometry is not None
        self.preprocess(slot.nv12, slot.geometry, slot.net_in[0], self.stream)

    def run(
        self,
        nv12: torch.Tensor,
        geometry: Nv12Geometry,
        params: PostprocessParams,
        ready: torch.cuda.Event | None = None,
    ) -> RunResult:
        """Detect in one NV12 (or P016: `geometry.bits`) frame; blocks until its result is on
        the host.

        `ready` (the decoder's event) is waited on by this source's stream before the frame is
        read (without one: the caller's current stream); the frame's memory is marked in use
        by that stream until the copy is done.
        """
        if geometry.input_hw != self.input_hw:
            raise ValueError(f"geometry is for input {geometry.input_hw}, runner {self.input_hw}")
        if tuple(nv12.shape) != geometry.nv12_shape or nv12.dtype != geometry.surface_dtype:
            raise ValueError(
                f"nv12 must be {geometry.nv12_shape} {geometry.surface_dtype}, got "
                f"{tuple(nv12.shape)} {nv12.dtype}"
            )
        started = time.perf_counter()
        key = (geometry, params)
        with self._lock:
            slot = self._slots.get(key)
            fresh = slot is None
            if slot is None:
                slot = self._new_slot(geometry, params, nv12)
            assert slot.nv12 is not None
            with CUDA_WORK.work(), on_stream(self.stream):
                self._wait_for(nv12, ready)
                slot.nv12.copy_(nv12, non_blocking=True)
            if fresh:
                self._prepare(slot)
                self._slots.put(key, slot)
            replayed, launch = self._execute(slot)
            detections = self._detections(slot, 0, geometry)
        return RunResult(detections, time.perf_counter() - started, replayed, launch)

    def run_frame(self, frame: Nv12Frame, params: PostprocessParams) -> RunResult:
        """`run` with the geometry and colour a decoded frame carries."""
        geometry = Nv12Geometry.of(
            frame.size_wh, self.input_hw, frame.matrix, frame.colour_range, frame.bits
        )
        return self.run(frame.nv12, geometry, params, frame.ready)


def batch_buckets(batch: int) -> tuple[int, ...]:
    """The batch sizes a batched runner keeps graphs for: powers of two below `batch`, and
    `batch` (8 -> 1, 2, 4, 8; 6 -> 1, 2, 4, 6)."""
    sizes, size = [], 1
    while size < batch:
        sizes.append(size)
        size *= 2
    return (*sizes, batch)


@dataclass(frozen=True)
class BatchOutput:
    """What one batch's graph computed, copied off the runner's buffers for its frames' threads.

    `counts` (n,) and `rows` (n, max_det, 6) are decode + NMS's output per frame in batch
    order; `heads` the raw network output of the frames whose count is negative (decode + NMS
    gave up: the host reference decodes them). Owned by the caller: the runner's buffers
    are free for the next batch once this exists.
    """

    counts: np.ndarray
    rows: FloatArray
    heads: dict[int, FloatArray]
    params: PostprocessParams
    replayed: bool
    launch_seconds: float

    def detections(self, index: int, geometry: Nv12Geometry) -> Detections:
        """Frame `index`'s detections in its source's pixels (any thread)."""
        return _parse_rows(
            int(self.counts[index]),
            self.rows[index],
            self.heads.get(index),
            self.params,
            geometry,
        )


@dataclass
class LaunchedBatch:
    """A batch on the GPU (from `launch`): what `finish` needs to collect it."""

    slot: _Slot
    frames: int
    replayed: bool
    launch_seconds: float


class BatchedGraphRunner(_RunnerBase):
    """Up to `batch` frames of any sources per call, preprocessed into one static batch that a
    graph of network + decode + NMS + copy runs as a whole.

    `network` maps (batch, 3, H, W) -> (batch, 4 + nc, N). Without `network_for_batch` every
    batch replays the batch-`batch` graph, padded (unused slots are ignored). With it (a
    network per batch size, as backends' `network_for_batch`), a batch of n frames replays the
    graph of the smallest bucket of `batch_buckets(batch)` that holds n: under real-time load
    most gathers hold a few frames, and a padded graph spends GPU time on its empty slots. One
    graph
    per (params, bucket); every bucket's graph reads
    the first rows of one shared staging batch.

    Two ways to drive it, one at a time: `run_batch` (all frames from one thread), or the
    steps a batcher spreads over threads, so that per-frame host work runs in each frame's
    own thread and the batching thread only launches and waits: each frame's thread
    `stage`s it into its index (in parallel), then one thread `launch`es the batch and
    `finish`es it into a `BatchOutput`, from which each frame's thread reads its detections.
    Frames of the next batch may be staged once `launch` has returned (the stream orders them
    after the running graph); the next `launch` must wait for `finish`.
    """

    def __init__(
        self,
        network: Network,
        *,
        input_hw: tuple[int, int],
        batch: int,
        options: RunnerOptions = RunnerOptions(),
        name: str = "batched gpu runner",
        network_for_batch: Callable[[int], Network] | None = None,
    ) -> None:
        if batch < 1:
            raise ValueError(f"batch must be at least 1, got {batch}")
        buckets = batch_buckets(batch) if network_for_batch is not None else (batch,)
        super().__init__(
            network,
            input_hw=input_hw,
            batch=batch,
            options=options,
            cache_size=options.cache_size * len(buckets),
            name=name,
        )
        # Built now, not at a bucket's first use: loading a network mid-stream stalls it.
        self._networks: dict[int, Network] = {batch: network}
        if network_for_batch is not None:
            for size in buckets[:-1]:
                self._networks[size] = network_for_batch(size)
        self.buckets = buckets
        H, W = self.input_hw
        with on_stream(self.stream):
            self._staging = torch.zeros((batch, 3, H, W), dtype=self.dtype, device=self.device)

    def bucket_of(self, frames: int) -> int:
        """The batch size of the graph that runs `frames` frames."""
        return next(size for size in self.buckets if size >= frames)

    def stage(
        self,
        index: int,
        nv12: torch.Tensor,
        geometry: Nv12Geometry,
        ready: torch.cuda.Event | None = None,
    ) -> None:
        """Preprocess one frame into position `index` of the next batch, on the runner's
        stream after the frame's `ready` event; no wait. Threads may stage distinct indexes
        at once."""
        if not 0 <= index < self.batch:
            raise ValueError(f"index must be in 0..{self.batch - 1}, got {index}")
        if geometry.input_hw != self.input_hw:
            raise ValueError(f"geometry is for input {geometry.input_hw}, runner {self.input_hw}")
        with CUDA_WORK.work(), on_stream(self.stream):
            self._wait_for(nv12, ready)
            self.preprocess(nv12, geometry, self._staging[index], self.stream)

    def launch(self, frames: int, params: PostprocessParams) -> LaunchedBatch:
        """Run the graph of the bucket that holds the `frames` staged frames; no wait (a new
        bucket or params is captured first, which does wait)."""
        if not 1 <= frames <= self.batch:
            raise ValueError(f"a batch holds 1..{self.batch} frames, got {frames}")
        size = self.bucket_of(frames)
        key = (params, size)
        with self._lock:
            slot = self._slots.get(key)
            if slot is None:
                slot = self._new_slot(
                    None, params, None, size, self._networks[size], self._staging[:size]
                )
                self._prepare(slot)
                self._slots.put(key, slot)
            replayed, launch = self._enqueue(slot)
        return LaunchedBatch(slot, frames, replayed, launch)

    def finish(self, launched: LaunchedBatch) -> BatchOutput:
        """Wait for a launched batch and copy its results off the runner's buffers."""
        self._finish()
        slot, n = launched.slot, launched.frames
        counts = slot.host_count[:n].numpy().copy()
        rows = slot.host_boxes[:n].numpy().copy()
        heads = {i: self._head(slot, i) for i in np.flatnonzero(counts < 0).tolist()}
        return BatchOutput(
            counts, rows, heads, slot.params, launched.replayed, launched.launch_seconds
        )

    def run_batch(
        self,
        frames: Sequence[tuple[torch.Tensor, Nv12Geometry, torch.cuda.Event | None]],
        params: PostprocessParams,
    ) -> list[RunResult]:
        """Detect in 1..batch frames (nv12, geometry, ready event); results in input order."""
        if not 1 <= len(frames) <= self.batch:
            raise ValueError(f"run_batch takes 1..{self.batch} frames, got {len(frames)}")
        started = time.perf_counter()
        for i, (nv12, geometry, ready) in enumerate(frames):
            self.stage(i, nv12, geometry, ready)
        output = self.finish(self.launch(len(frames), params))
        detections = [output.detections(i, geometry) for i, (_, geometry, _) in enumerate(frames)]
        seconds = time.perf_counter() - started
        return [RunResult(d, seconds, output.replayed, output.launch_seconds) for d in detections]


def as_numpy_rows(result: RunResult) -> FloatArray:
    """(n, 6) float32 rows x1, y1, x2, y2, score, class_id of a result (tests, benchmarks)."""
    d = result.detections
    return np.concatenate(
        (d.xyxy, d.scores[:, None], d.class_ids[:, None].astype(np.float32)), axis=1
    ).astype(np.float32)


__all__ = [
    "BatchOutput",
    "BatchedGraphRunner",
    "CaptureFn",
    "CudaGraphRunner",
    "GraphCache",
    "LaunchedBatch",
    "Nv12Frame",
    "Replayable",
    "RunResult",
    "RunnerOptions",
    "as_numpy_rows",
    "batch_buckets",
    "capture_cuda_graph",
]
