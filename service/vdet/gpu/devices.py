"""The GPU side of the service: one device per GPU, and which GPU runs which stream.

A `GpuDevice` owns everything one GPU does for its streams: the readers it hands out decode
with NVDEC on that GPU (vdet.ingest.nvdec_reader; a stream NVDEC cannot decode falls back to
the CPU reader and then goes through the CPU `Detector`), and each NV12 frame becomes
detections through a CUDA graph (vdet.gpu.graphs): per stream, a `CudaGraphRunner`
on the stream's own CUDA stream (batch 1, lowest latency), or, with `gpu.batch` K > 1, one
`BatchedGraphRunner` running up to K ready frames of any of the GPU's streams as one graph
(vdet.gpu.batcher: each stream's thread stages its own frame; a batcher thread launches
the batch). `GpuPool`
holds the devices and places each new stream with vdet.gpu.placement (pinned, sticky, least
loaded), so a frame's whole life stays on one GPU.

Input shapes (vdet.gpu.input_shapes, setting `input_shape`): a graph is captured for one input
shape, so a stream's runner is built for the shape its resolution needs and rebuilt when a
resolution change needs another one; batching keeps one batcher (and batched runner) per input
shape, the 16:9 one built with the device and others when a frame first needs them, so a batch
holds frames of one shape and cameras of mixed resolutions still batch. Interpreter tuning for
many streams: vdet.gpu.gil.

Isolation: each device has its own CUDA streams, runners and network replica; an exception on
one GPU fails that frame only (the stream manager records it on the stream), and a GPU whose
CUDA context is lost keeps failing its own streams while the other GPUs go on.

Timings: preprocess, network and decode + NMS run as one graph on the GPU, so their time is
reported as the `inference` stage; `postprocess` is the host's share (rows to boxes in source
pixels). This module never decides whether to use the GPU (the app does) and speaks no HTTP.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from vdet.config.gpu import GpuSettings
from vdet.core.types import Detections, ImageArray, StageTimings
from vdet.cuda.capture_guard import CUDA_WORK
from vdet.cuda.host_wait import HostWait
from vdet.gpu.batcher import Batcher
from vdet.gpu.frame_ops import (
    DecodeNmsFn,
    Nv12Geometry,
    PreprocessFn,
    kernel_ops,
    surface_to_rgb_u8,
)
from vdet.gpu.graphs import BatchedGraphRunner, CudaGraphRunner, Network, RunnerOptions
from vdet.gpu.input_shapes import COMMON_SOURCE_WH, InputShapes, has_rect_inputs
from vdet.gpu.placement import PlacementError, SourceDemand, assign
from vdet.inference.backends.base import InferenceBackend
from vdet.inference.backends.torch import TorchBackend
from vdet.inference.postprocess import PostprocessParams
from vdet.ingest.nvdec import GpuVideoFrame
from vdet.ingest.nvdec_reader import select_reader
from vdet.ingest.reader import SourceReader

log = logging.getLogger(__name__)

# network_factory(batch, (H, W)) -> a network for (batch, 3, H, W) inputs on the device.
NetworkFactory = Callable[[int, tuple[int, int]], Network]


@dataclass(frozen=True)
class GpuTuning:
    """How a GPU device does its work, where one choice was measured best and no operator needs
    another (so none is a setting): the tests (a CPU stand-in runs the torch ops eagerly) and
    the lab's comparisons (bench/gpu/) pass others.

    `ops`: vdet's CUDA kernels for preprocess and decode + NMS where they compile (auto), always
    (cuda: fail otherwise) or torch's reference ops (torch); `cuda_graphs`: each frame's work in
    one CUDA graph, else eager; `host_wait`: how threads wait for the GPU (vdet.cuda.host_wait:
    block lets a waiting thread sleep, which keeps the cores for the streams with work);
    `layer_kernels`: a torch network's conv bias + SiLU and SPPF pools through vdet's kernels;
    `frames_per_stream`: with batching, frames of one stream in detection at once (2: the next
    is staged while the last one runs, so batches follow each other without the GPU idling).
    """

    ops: Literal["auto", "cuda", "torch"] = "auto"
    cuda_graphs: bool = True
    host_wait: HostWait = "block"
    layer_kernels: bool = True
    frames_per_stream: int = 2


def choose_ops(
    ops: str, device: torch.device
) -> tuple[PreprocessFn | None, DecodeNmsFn | None, str]:
    """The preprocess and decode + NMS ops for `GpuTuning.ops`, and a name for logs and metrics.

    None, None means the torch reference ops (vdet.gpu.frame_ops), which run anywhere.
    """
    if ops == "torch" or device.type != "cuda":
        return None, None, "torch"
    try:
        preprocess, decode_nms = kernel_ops(device.index or 0)
    except (ImportError, RuntimeError, OSError) as exc:
        if ops == "cuda":
            raise RuntimeError(
                f"vdet's CUDA kernels cannot run on {device}: {exc} (install the gpu extra: "
                "cuda-bindings and nvidia-cuda-nvrtc)"
            ) from exc
        log.warning("vdet CUDA kernels unavailable on %s (%s); using torch ops", device, exc)
        return None, None, "torch"
    return preprocess, decode_nms, "cuda"


def frame_to_bgr(frame: GpuVideoFrame) -> ImageArray:
    """The frame as an 8-bit BGR host image (snapshots), converted on its device."""
    geometry = Nv12Geometry.of(frame.size_wh, (2, 2), frame.matrix, frame.colour_range, frame.bits)
    if frame.ready is not None:
        frame.ready.synchronize()
    with CUDA_WORK.work(), torch.no_grad():
        rgb = surface_to_rgb_u8(frame.nv12, geometry)  # (3, h, w) float32 0..255
        bgr = rgb.flip(0).permute(1, 2, 0).to(torch.uint8).contiguous()
    return np.ascontiguousarray(bgr.cpu().numpy())


class GpuDevice:
    """Everything one GPU does for the streams placed on it (module docstring).

    `device` is a torch device (cuda:N; "cpu" runs the same code without CUDA, for tests);
    `network_factory(batch, input_hw)` gives the network for a batch size and input shape on
    that device (called once per stream runner: a TensorRT network is an execution context of
    its own), `dtype` and `channels_last` describe the input it takes; `input_shapes` says
    which input shape a frame runs at (default: always `input_hw`, the model's); `nvc`
    replaces the PyNvVideoCodec module in the readers, and `index` gives a CPU-backed device a GPU
    index to stand for (both for tests on the CPU).
    Thread-safe.
    """

    def __init__(
        self,
        device: torch.device | str,
        network_factory: NetworkFactory,
        *,
        input_hw: tuple[int, int],
        dtype: torch.dtype,
        settings: GpuSettings,
        tuning: GpuTuning = GpuTuning(),
        on_eager_fallback: Callable[[], None] | None = None,
        nvc: Any = None,
        index: int | None = None,
        channels_last: bool = True,
        input_shapes: InputShapes | None = None,
    ) -> None:
        self.device = torch.device(device)
        cuda = self.device.type == "cuda"
        # The CUDA device index (-1 on the CPU); also the NVDEC GPU and the metrics label.
        if index is None:
            index = (self.device.index or 0) if cuda else -1
        self.index = index
        self.label = str(index) if index >= 0 else "cpu"
        self.settings = settings
        self.tuning = tuning
        self.input_hw = input_hw
        self.input_shapes = InputShapes(input_hw) if input_shapes is None else input_shapes
        if self.input_shapes.model_hw != input_hw:
            raise ValueError(
                f"input_shapes are for a {self.input_shapes.model_hw} model, not {input_hw}"
            )
        self.dtype = dtype
        self.channels_last = channels_last
        self._network_factory = network_factory
        self._nvc = nvc
        self.preprocess, self.decode_nms, self.ops_name = choose_ops(tuning.ops, self.device)
        # What every runner of this device shares; each gets its own network, shape and name.
        self.runner_options = RunnerOptions(
            dtype=dtype,
            device=self.device,
            preprocess=self.preprocess,
            decode_nms=self.decode_nms,
            channels_last=channels_last,
            use_graphs=tuning.cuda_graphs,
            on_eager_fallback=on_eager_fallback,
            blocking_wait=tuning.host_wait == "block",
        )
        self._lock = threading.Lock()
        # One runner per stream, for the input shape of its latest frame.
        self._runners: dict[str, CudaGraphRunner] = {}
        # With gpu.batch > 1: one batcher per input shape, made when a frame first needs it.
        self._batchers: dict[tuple[int, int], Batcher] = {}
        self.runner_rebuilds = 0  # stream runners replaced for a new input shape
        self._closed = False
        if settings.batch > 1:
            # Built now, not on a first frame (that would stall it for seconds): the only
            # shape, or with rect inputs the 16:9 one (1080p and 720p cameras); others on demand.
            self._batcher_for(self.input_shapes.of(COMMON_SOURCE_WH))

    def _batcher_for(self, input_hw: tuple[int, int]) -> Batcher:
        batcher = self._batchers.get(input_hw)  # lock-free read, as in `_runner`
        if batcher is not None and not self._closed:
            return batcher
        with self._lock:
            if self._closed:
                raise RuntimeError(f"GPU device {self.label} is closed")
            batcher = self._batchers.get(input_hw)
            if batcher is None:
                H, W = input_hw
                batch = self.settings.batch
                runner = BatchedGraphRunner(
                    self._network_factory(batch, input_hw),
                    input_hw=input_hw,
                    options=self.runner_options,
                    name=f"gpu {self.label} batched runner {W}x{H}",
                    batch=batch,
                    # a graph per batch-size bucket, at this shape
                    network_for_batch=lambda size: self._network_factory(size, input_hw),
                )
                batcher = Batcher(
                    runner,
                    self.settings.batch_wait_ms / 1000.0,
                    f"vdet-batcher-gpu{self.label}-{W}x{H}",
                )
                self._batchers[input_hw] = batcher
            return batcher

    # --- ingest -----------------------------------------------------------------------------

    def open_reader(self, url: str, **options: Any) -> SourceReader:
        """A reader decoding on this GPU per `gpu.decoder`: this device's `ReaderFactory`
        (options as `SourceReader` takes them)."""
        if self.device.type != "cuda" and self._nvc is None:
            return SourceReader(url, **options)
        return select_reader(
            url,
            decoder=self.settings.decoder,
            gpu=max(self.index, 0),
            nvc=self._nvc,
            device=None if self._nvc is None else str(self.device),
            **options,
        )

    # --- detection --------------------------------------------------------------------------

    def detect(
        self, source_id: str, frame: GpuVideoFrame, params: PostprocessParams
    ) -> tuple[Detections, StageTimings]:
        """Detections of one decoded frame, in source pixels, and where the time went."""
        input_hw = self.input_shapes.of(frame.size_wh)
        if self.settings.batch > 1:
            result = self._batcher_for(input_hw).submit(frame, params)
        else:
            result = self._runner(source_id, input_hw).run_frame(frame, params)
        return result.detections, StageTimings(inference=result.seconds)

    @property
    def frames_in_flight(self) -> int:
        """Frames of one stream to hand this device at once. Batching: `GpuTuning.
        frames_per_stream` (2: one in the batch on the GPU and the next staged into the batch
        after it, so that a process's batches run back to back; with one frame per stream
        every batch waited for the last one's results to reach its streams' threads before it
        could fill, and the GPU idled meanwhile). Without batching 1: a stream's runner runs
        its frames one at a time anyway."""
        return self.tuning.frames_per_stream if self.settings.batch > 1 else 1

    def to_bgr(self, frame: GpuVideoFrame) -> ImageArray:
        """A decoded frame as a BGR host image (snapshots)."""
        return frame_to_bgr(frame)

    def _runner(self, source_id: str, input_hw: tuple[int, int]) -> CudaGraphRunner:
        # Every frame of every stream comes here: the common case reads the dict without the
        # device's lock (a dict read is atomic), since a lock that all of a GPU's pipeline
        # threads take per frame queues them behind the GIL (64 streams: 29% of thread samples).
        runner = self._runners.get(source_id)
        if runner is not None and runner.input_hw == input_hw and not self._closed:
            return runner
        stale = None
        with self._lock:
            if self._closed:
                raise RuntimeError(f"GPU device {self.label} is closed")
            runner = self._runners.get(source_id)
            if runner is not None and runner.input_hw != input_hw:
                # A resolution change that needs another input shape: the graphs are captured
                # for one shape, so the stream gets a runner for the new one.
                stale, runner = runner, None
            if runner is None:
                H, W = input_hw
                runner = CudaGraphRunner(
                    self._network_factory(1, input_hw),
                    input_hw=input_hw,
                    options=self.runner_options,
                    name=f"gpu {self.label} runner of {source_id} at {W}x{H}",
                )
                self._runners[source_id] = runner
                if stale is not None:
                    self.runner_rebuilds += 1
        if stale is not None:
            log.info(
                "stream %s: input %dx%d -> %dx%d, its GPU runner is rebuilt",
                source_id,
                stale.input_hw[1],
                stale.input_hw[0],
                input_hw[1],
                input_hw[0],
            )
            stale.close()
        return runner

    @property
    def batched_shapes(self) -> list[tuple[int, int]]:
        """The input shapes (H, W) this device has a batcher for (gpu.batch > 1)."""
        with self._lock:
            return list(self._batchers)

    def runner_shape(self, source_id: str) -> tuple[int, int] | None:
        """The input shape (H, W) of a stream's runner; None before its first frame, or when
        batching."""
        runner = self._runners.get(source_id)
        return None if runner is None else runner.input_hw

    def release(self, source_id: str) -> None:
        """Free a removed stream's runner (its graphs, static buffers and CUDA stream)."""
        with self._lock:
            runner = self._runners.pop(source_id, None)
        if runner is not None:
            runner.close()

    # --- state ------------------------------------------------------------------------------

    def memory_bytes(self) -> int:
        """Bytes this process holds in the GPU's caching allocator (networks, graphs, frames).

        NVDEC's own decode surfaces live outside it and are not included.
        """
        if self.device.type != "cuda":
            return 0
        return int(torch.cuda.memory_reserved(self.device))

    def describe(self) -> str:
        mode = f"batch {self.settings.batch}" if self.settings.batch > 1 else "per-stream"
        graphs = "cuda graphs" if self.tuning.cuda_graphs else "eager"
        shapes = self.input_shapes.describe()
        return f"{self.device} ({mode}, {graphs}, {self.ops_name} ops, {shapes})"

    def close(self) -> None:
        with self._lock:
            self._closed = True
            runners, self._runners = list(self._runners.values()), {}
            batchers, self._batchers = list(self._batchers.values()), {}
        for batcher in batchers:
            batcher.close()
            batcher.runner.close()
        for runner in runners:
            runner.close()


class GpuPool:
    """The node's GPU devices and the placement of streams on them (module docstring)."""

    def __init__(
        self, devices: Sequence[GpuDevice], *, max_streams_per_gpu: int | None = None
    ) -> None:
        if not devices:
            raise ValueError("a GpuPool needs at least one device")
        self.devices = tuple(devices)
        self._max_per_gpu = max_streams_per_gpu
        self._lock = threading.Lock()
        self._placed: dict[str, int] = {}  # stream id -> position in self.devices
        self._position = {w.index: i for i, w in enumerate(self.devices)}
        if len(self._position) != len(self.devices):
            raise ValueError("one device per GPU: two devices have the same GPU index")

    def place(self, source_id: str, pinned_gpu: int | None = None) -> GpuDevice:
        """Choose the device of a new stream; PlacementError (a ValueError) if it cannot."""
        with self._lock:
            demands = [SourceDemand(sid) for sid in self._placed if sid != source_id]
            previous = dict(self._placed)
            pinned = None
            if pinned_gpu is not None:
                pinned = self._position.get(pinned_gpu)
                if pinned is None:
                    raise PlacementError(
                        f"stream {source_id!r} asks for gpu {pinned_gpu}, but this server runs "
                        f"on GPU(s) {sorted(self._position)}"
                    )
            demands.append(SourceDemand(source_id, pinned))
            # Sticky placement keeps every running stream where it is; only the new one moves.
            placed = assign(
                demands,
                len(self.devices),
                previous=previous,
                max_streams_per_gpu=self._max_per_gpu,
            )
            self._placed[source_id] = placed[source_id]
            return self.devices[placed[source_id]]

    def device_of(self, source_id: str) -> GpuDevice:
        with self._lock:
            return self.devices[self._placed[source_id]]

    def release(self, source_id: str) -> None:
        with self._lock:
            position = self._placed.pop(source_id, None)
        if position is not None:
            self.devices[position].release(source_id)

    def streams_by_gpu(self) -> dict[str, int]:
        """Streams placed on each device, by GPU label."""
        with self._lock:
            counts = dict.fromkeys((w.label for w in self.devices), 0)
            for position in self._placed.values():
                counts[self.devices[position].label] += 1
            return counts

    def describe(self) -> str:
        return "; ".join(w.describe() for w in self.devices)

    def close(self) -> None:
        for device in self.devices:
            device.close()


def _apply_host_wait(index: int, mode: str) -> None:
    """`GpuTuning.host_wait` on one GPU; without cuda-python or a driver that takes it, CUDA's
    default stays (logged: the service still runs, its waits spin)."""
    from vdet.cuda.host_wait import set_host_wait

    try:
        set_host_wait(index, mode)
    except (ImportError, RuntimeError) as exc:
        log.warning(
            "host wait %r not applied on GPU %d (%s); CUDA's default stays", mode, index, exc
        )
        return
    log.info("GPU %d: host threads wait for it the %r way", index, mode)


def build_gpu_pool(
    settings: GpuSettings,
    backend: InferenceBackend,
    *,
    on_eager_fallback: Callable[[], None] | None = None,
    input_shape: Literal["rect", "square"] = "rect",
    tuning: GpuTuning = GpuTuning(),
) -> GpuPool:
    """One device per GPU of `settings.devices` (None: every visible GPU) for a backend that
    feeds the GPU data path (torch, or a TensorRT raw-head engine: `gpu_data_path`), built
    from what the backend declares (`network_for`, `network_dtype`, `network_channels_last`,
    `rect_networks`, `network_min_hw`, `replica`).

    `input_shape` "rect" runs each frame at its rectangular input where the backend's networks
    take one (torch: a model with dynamic height and width; TensorRT: an engine whose profile
    covers smaller inputs), "square" always at the model's input size.

    The backend's own GPU uses the backend; every other GPU gets its `replica`.
    """
    if not backend.gpu_data_path:
        raise TypeError(f"{backend!r} does not feed the GPU data path (gpu_data_path is False)")
    count = torch.cuda.device_count()
    indices = settings.devices if settings.devices is not None else list(range(count))
    if missing := [d for d in indices if not 0 <= d < count]:
        raise ValueError(f"gpu.devices {missing} do not exist; this node has {count} GPU(s)")

    devices = []
    for index in indices:
        _apply_host_wait(index, tuning.host_wait)
        source: InferenceBackend = backend.replica(index)
        if isinstance(source, TorchBackend):  # networks built from here on follow the setting
            source.layer_kernels = tuning.layer_kernels
        shapes = InputShapes(
            backend.info.input_hw,
            backend.info.stride,
            rect=input_shape == "rect"
            and source.rect_networks
            and has_rect_inputs(backend.info.input_hw, backend.info.stride),
            min_hw=source.network_min_hw,
        )
        devices.append(
            GpuDevice(
                torch.device("cuda", index),
                source.network_for,
                input_hw=backend.info.input_hw,
                dtype=source.network_dtype,
                settings=settings,
                tuning=tuning,
                on_eager_fallback=on_eager_fallback,
                channels_last=source.network_channels_last,
                input_shapes=shapes,
            )
        )
    return GpuPool(devices, max_streams_per_gpu=settings.max_streams_per_gpu)


__all__ = [
    "GpuDevice",
    "GpuPool",
    "NetworkFactory",
    "build_gpu_pool",
    "choose_ops",
    "frame_to_bgr",
]
