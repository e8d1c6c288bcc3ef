"""TensorRT: a serialized engine from the engine cache, one execution context per source.

This module owns `TensorRTBackend`, registered twice: kind `tensorrt` (full TensorRT, priority
300: `auto`'s first choice where `tensorrt` imports and a GPU exists) and kind `tensorrt-rtx`
(TensorRT for RTX, priority 290, where it imports and the GPU's compute capability is one it
runs on: 8.0, 8.6, 8.9, 12.x, not Hopper). One class serves both: the plan's manifest names its
library, and `vdet.tensorrt.library` says what differs (the module, the runtime config with its
JIT runtime cache on TensorRT for RTX, persisted beside the plan per GPU).

It deserializes one plan once, then gives every calling thread (each video source runs its own
pipeline thread) its own `IExecutionContext`, CUDA stream and device buffers, so sources never
wait for each other's copies. `infer` is the host-side generic contract: float32 NCHW in, the
raw head out (`set_input_shape`, `set_tensor_address`, `execute_async_v3`, then a synchronise).
An end-to-end engine (built with the decode + NMS plugin, `engine.plugin_nms`, full TensorRT
only) has no raw head; `infer_end_to_end` returns its detections. On the GPU data path a
raw-head engine is a `TensorRTGraphNetwork`: vdet.gpu.graphs captures our NV12
letterbox kernel, the engine's enqueue and our NVRTC decode + NMS kernel in one CUDA graph.

Engines come from `vdet.modelkit` (build and cache); this module never builds one itself except
through `EngineRequest.get_or_build`. For an ONNX model without a valid cached engine the
factory either builds first, or (`engine.build_in_background`, the default) serves on the torch
backend on CUDA (ONNX Runtime where torch cannot run) and swaps TensorRT in when the engine is
ready (`handoff.serve_while_building`).
"""

from __future__ import annotations

import logging
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from vdet.core.contract import STRIDE
from vdet.core.model import ModelInfo
from vdet.core.types import FloatArray
from vdet.cuda.runtime import CudaError, GpuIdentity, cuda_call, gpu_count, gpu_identity, runtime
from vdet.inference.backends import BackendSpec, register_backend
from vdet.inference.backends.base import InferenceBackend
from vdet.tensorrt.cache import (
    CachedEngine,
    EngineCache,
    EngineKey,
    EngineManifest,
    EngineMismatchError,
    verify_plan,
)
from vdet.tensorrt.library import TENSORRT, TENSORRT_RTX, LibraryError, TensorRTLibrary, library

if TYPE_CHECKING:
    from vdet.config.engine import EngineSettings

log = logging.getLogger(__name__)

PLAN_SUFFIXES = frozenset({".plan", ".engine", ".trt"})
DETECTIONS = "detections"
NUM_DETECTIONS = "num_detections"


def tensorrt_available() -> bool:
    """TensorRT's Python package is installed and the CUDA runtime sees a GPU."""
    return TENSORRT.installed() and gpu_count() > 0


def tensorrt_rtx_available(device: int = 0) -> bool:
    """TensorRT for RTX is installed and GPU `device` is one it runs on."""
    return unavailable_reason(TENSORRT_RTX, device) is None


def unavailable_reason(lib: TensorRTLibrary, device: int = 0) -> str | None:
    """Why `lib` cannot serve on GPU `device` here; None when it can."""
    if not lib.installed():
        return f"{lib.title} is not installed"
    if gpu_count() == 0:
        return "no CUDA GPU is visible"
    try:
        gpu = gpu_identity(device)
    except CudaError as exc:
        return f"GPU {device} cannot be queried ({exc})"
    if not lib.runs_on(gpu.compute_capability):
        return (
            f"{lib.title} does not run on {gpu.name} (compute capability "
            f"{gpu.compute_capability}; it serves {', '.join(sorted(lib.runtime_targets or ()))})"
        )
    return None


def plan_refusals(
    key: EngineKey, lib: TensorRTLibrary, version: str, gpu: GpuIdentity
) -> list[str]:
    """Why a plan with `key` cannot run with `lib` `version` on `gpu`; empty when it can.

    Full TensorRT: the same version and the GPU model it was built on. TensorRT for RTX: the
    same version and a GPU whose compute capability is one of the plan's targets.
    """
    reasons = []
    if key.flavour != lib.flavour:
        reasons.append(f"built with {library(key.flavour).title}, this is {lib.title}")
    elif key.tensorrt_version != version:
        reasons.append(f"built with {lib.title} {key.tensorrt_version}, this is {version}")
    if key.flavour == TENSORRT_RTX.flavour:
        if gpu.compute_capability not in key.targets:
            reasons.append(
                f"built for compute capability {', '.join(key.targets)}, this is {gpu.name} "
                f"({gpu.compute_capability})"
            )
    elif (key.gpu_name, key.compute_capability) != (gpu.name, gpu.compute_capability):
        reasons.append(
            f"built for {key.gpu_name} (sm {key.compute_capability}), this is {gpu.name} "
            f"(sm {gpu.compute_capability})"
        )
    return reasons


def runtime_cache_path(plan: Path, gpu: GpuIdentity) -> Path:
    """Where TensorRT for RTX's JIT runtime cache for `plan` on `gpu` lives: beside the plan,
    one per GPU model (the cache is only valid for the GPU and driver that compiled it)."""
    slug = re.sub(r"[^a-z0-9]+", "-", gpu.name.lower()).strip("-") or "gpu"
    return plan.with_name(f"{plan.stem}.{slug}.runtime-cache")


@dataclass
class _Lane:
    """One source's execution context, stream and device buffers (sized for the profile max)."""

    context: Any
    stream: Any
    buffers: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (ptr, bytes)
    warmed: bool = False


class TensorRTBackend(InferenceBackend):
    """A deserialized TensorRT or TensorRT-for-RTX engine; a context, stream and buffers per
    calling thread. `name` is the plan's library flavour."""

    name = TENSORRT.flavour

    def __init__(self, plan: str | os.PathLike[str], *, device: int = 0) -> None:
        from vdet.tensorrt.build import _make_logger

        plan = Path(plan)
        manifest = verify_plan(plan)
        try:
            self.library = library(manifest.key.flavour)
            trt = self.library.load()
        except LibraryError as exc:
            raise RuntimeError(f"{plan}: {exc}") from exc
        self._trt = trt
        self.name = self.library.flavour
        self._gpu = self._check_here(plan, manifest, device, self.library, str(trt.__version__))
        self.manifest = manifest
        self.plan = plan
        self.info = _model_info(plan, manifest)
        self.precision = manifest.key.precision
        self._device = device
        rt = runtime()
        cuda_call(rt.cudaSetDevice(device), "cudaSetDevice")
        cuda_call(rt.cudaFree(0), "cudaFree(0)")  # the context the runtime cache checks against
        if manifest.key.plugin_sha256 is not None:
            from vdet.tensorrt.plugin_library import load_for_plan

            load_for_plan(trt, manifest.build.get("plugin_library"), manifest.key.plugin_sha256)
        self._logger = _make_logger(trt, verbose=False)
        self._runtime = trt.Runtime(self._logger)
        self._engine = self._runtime.deserialize_cuda_engine(plan.read_bytes())
        if self._engine is None:
            raise RuntimeError(
                f"{self.library.title} {trt.__version__} cannot deserialize {plan}: "
                f"{'; '.join(self._logger.errors) or 'see its log'}"
            )
        names = [self._engine.get_tensor_name(i) for i in range(self._engine.num_io_tensors)]
        inputs = [n for n in names if self._engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        if len(inputs) != 1:
            raise RuntimeError(f"{plan}: expected one input tensor, the engine has {inputs}")
        self._input = inputs[0]
        self._outputs = [n for n in names if n != self._input]
        self.end_to_end = set(self._outputs) == {DETECTIONS, NUM_DETECTIONS}
        profile = manifest.key.profile
        self._max_batch = profile.max
        self._network_min_hw = self._profile_min_hw()
        self._lock = threading.Lock()
        self._local = threading.local()
        self._lanes: list[_Lane] = []
        self._closed = False
        self.runtime_cache: Path | None = None
        self._runtime_cache: Any = None
        self._runtime_config = self._make_runtime_config()

    @staticmethod
    def _check_here(
        plan: Path, manifest: EngineManifest, device: int, lib: TensorRTLibrary, version: str
    ) -> GpuIdentity:
        """Refuse a plan built for another library, version or GPU, with the reasons."""
        gpu = gpu_identity(device)
        reasons = plan_refusals(manifest.key, lib, version, gpu)
        if reasons:
            raise EngineMismatchError(
                f"{plan} cannot run here: {'; '.join(reasons)}. Rebuild it: vdet engine build"
            )
        return gpu

    def _make_runtime_config(self) -> Any:
        """TensorRT for RTX: one runtime config for every context, with the JIT runtime cache
        loaded from beside the plan (kernels compiled for this GPU on an earlier start).

        Kernels compile at the first inference of each shape (the eager warm-up call before a
        CUDA graph is captured). EAGER specialization compiles the shape-specialized kernels
        right then, instead of in the background while a generic kernel runs: a graph captured
        during a LAZY swap would keep the generic kernel. vdet captures its own graphs, so the
        library's own graph capture stays off.
        """
        if not self.library.has_runtime_cache:
            return None
        trt = self._trt
        config = self._engine.create_runtime_config()
        config.dynamic_shapes_kernel_specialization_strategy = (
            trt.DynamicShapesKernelSpecializationStrategy.EAGER
        )
        config.cuda_graph_strategy = trt.CudaGraphStrategy.DISABLED
        cache = config.create_runtime_cache()
        path = runtime_cache_path(self.plan, self._gpu)
        if path.is_file():
            if cache.deserialize(path.read_bytes()):
                log.info("runtime cache %s loaded", path)
            else:
                log.warning(
                    "runtime cache %s does not fit this GPU, driver or %s version; kernels "
                    "compile again",
                    path,
                    self.library.title,
                )
        if not config.set_runtime_cache(cache):
            log.warning("%s refused the runtime cache; kernels compile on every start", self.name)
            return config
        self.runtime_cache, self._runtime_cache = path, cache
        return config

    def save_runtime_cache(self) -> bool:
        """Write the JIT runtime cache beside the plan (atomically); False when there is none
        or it cannot be written (a read-only cache folder only costs compile time)."""
        with self._lock:
            cache, path = self._runtime_cache, self.runtime_cache
            if cache is None or path is None:
                return False
            try:
                blob = cache.serialize()
                tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
                with open(tmp, "wb") as f:
                    f.write(blob)
                tmp.replace(path)
            except OSError as exc:
                log.warning("runtime cache %s not saved: %s", path, exc)
                return False
        return True

    def execution_context(self) -> Any:
        """A new execution context of the engine (through the runtime config on RTX)."""
        context = self.library.execution_context(self._engine, self._runtime_config)
        if context is None:
            raise RuntimeError(f"{self.library.title} could not create an execution context")
        return context

    @property
    def gpu_data_path(self) -> bool:
        return not self.end_to_end

    @property
    def device(self) -> str:
        key = self.manifest.key
        version = key.tensorrt_version
        where = self._gpu.name
        return f"cuda:{self._device} {where} ({self.library.flavour} {version}, {self.precision})"

    @property
    def max_batch(self) -> int | None:
        return self._max_batch

    # -- per-source lanes --

    def _lane(self) -> _Lane:
        lane: _Lane | None = getattr(self._local, "lane", None)
        if lane is not None:
            return lane
        rt = runtime()
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self!r} is closed")
            cuda_call(rt.cudaSetDevice(self._device), "cudaSetDevice")
            context = self.execution_context()
            stream = cuda_call(
                rt.cudaStreamCreateWithFlags(rt.cudaStreamNonBlocking), "cudaStreamCreate"
            )
            lane = _Lane(context=context, stream=stream)
            self._lanes.append(lane)
        self._local.lane = lane
        return lane

    def _buffer(self, lane: _Lane, name: str, nbytes: int) -> int:
        ptr, size = lane.buffers.get(name, (0, 0))
        if size >= nbytes:
            return ptr
        rt = runtime()
        if ptr:
            cuda_call(rt.cudaFree(ptr), "cudaFree")
        ptr = int(cuda_call(rt.cudaMalloc(max(nbytes, 1)), "cudaMalloc"))
        lane.buffers[name] = (ptr, nbytes)
        return ptr

    def _run(self, batch: np.ndarray[Any, Any]) -> dict[str, np.ndarray[Any, Any]]:
        """One chunk (n <= max batch) through this thread's context; host outputs by name."""
        trt, rt = self._trt, runtime()
        lane = self._lane()
        context, engine = lane.context, self._engine
        in_dtype = trt.nptype(engine.get_tensor_dtype(self._input))
        host_in = np.ascontiguousarray(batch, dtype=in_dtype)
        if not context.set_input_shape(self._input, tuple(host_in.shape)):
            raise RuntimeError(f"the engine does not accept input shape {host_in.shape}")
        ptr = self._buffer(lane, self._input, host_in.nbytes)
        context.set_tensor_address(self._input, ptr)
        h2d = rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        d2h = rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        cuda_call(
            rt.cudaMemcpyAsync(ptr, host_in.ctypes.data, host_in.nbytes, h2d, lane.stream),
            "cudaMemcpyAsync H2D",
        )
        hosts: dict[str, np.ndarray[Any, Any]] = {}
        for name in self._outputs:
            shape = tuple(context.get_tensor_shape(name))
            host = np.empty(shape, dtype=trt.nptype(engine.get_tensor_dtype(name)))
            out_ptr = self._buffer(lane, name, host.nbytes)
            context.set_tensor_address(name, out_ptr)
            hosts[name] = host
        if not context.execute_async_v3(int(lane.stream)):
            raise RuntimeError(f"TensorRT execution failed: {'; '.join(self._logger.errors[-3:])}")
        for name, host in hosts.items():
            ptr = lane.buffers[name][0]
            cuda_call(
                rt.cudaMemcpyAsync(host.ctypes.data, ptr, host.nbytes, d2h, lane.stream),
                "cudaMemcpyAsync D2H",
            )
        cuda_call(rt.cudaStreamSynchronize(lane.stream), "cudaStreamSynchronize")
        if not lane.warmed:
            lane.warmed = True
            self.save_runtime_cache()  # this shape's kernels are compiled now
        return hosts

    def _chunks(self, batch: FloatArray) -> list[dict[str, np.ndarray[Any, Any]]]:
        step = self._max_batch
        return [self._run(batch[i : i + step]) for i in range(0, len(batch), step)]

    # -- the contract --

    def infer(self, batch: FloatArray) -> FloatArray:
        batch = self.check_batch(batch)
        if self.end_to_end:
            raise RuntimeError(
                f"{self.plan} is an end-to-end engine (decode + NMS plugin): it has no raw head; "
                "use infer_end_to_end, or build without engine.plugin_nms for this pipeline"
            )
        (name,) = self._outputs
        raw = np.concatenate([out[name] for out in self._chunks(batch)], axis=0)
        return np.asarray(raw, dtype=np.float32)

    def infer_end_to_end(self, batch: FloatArray) -> tuple[FloatArray, np.ndarray[Any, Any]]:
        """An end-to-end engine's (detections [n, max_det, 6] float32, counts [n] int32)."""
        batch = self.check_batch(batch)
        if not self.end_to_end:
            raise RuntimeError(f"{self.plan} has no decode + NMS plugin outputs")
        chunks = self._chunks(batch)
        detections = np.concatenate([c[DETECTIONS] for c in chunks], axis=0)
        counts = np.concatenate([c[NUM_DETECTIONS] for c in chunks], axis=0)
        return detections.astype(np.float32, copy=False), counts.astype(np.int32, copy=False)

    # -- the GPU data path (vdet.gpu.devices) --

    @property
    def device_index(self) -> int:
        return self._device

    def input_torch_dtype(self) -> Any:
        """The torch dtype of the engine's input (FP16 engines built by the builder flag on
        TensorRT 10 keep an FP32 input)."""
        return _torch_dtype(self._trt, self._engine.get_tensor_dtype(self._input))

    def _profile_min_hw(self) -> tuple[int, int] | None:
        """The smallest (H, W) the engine's optimization profile takes, when its height and
        width are dynamic and the profile reaches up to the model's input; else None (the
        engine runs the model's input size only: a square-only plan from before rectangular
        inputs, or a model exported at a fixed size)."""
        dims = tuple(int(d) for d in self._engine.get_tensor_shape(self._input))
        if len(dims) != 4 or (dims[2] >= 0 and dims[3] >= 0):
            return None
        low, _, high = (
            tuple(int(d) for d in shape)
            for shape in self._engine.get_tensor_profile_shape(self._input, 0)
        )
        if tuple(high[2:]) != self.info.input_hw:
            return None
        return low[2], low[3]

    @property
    def network_min_hw(self) -> tuple[int, int] | None:
        """The smallest (H, W) of the engine's profile (`_profile_min_hw`)."""
        return self._network_min_hw

    @property
    def rect_networks(self) -> bool:
        """Whether `network_for` takes inputs smaller than the model's (rectangular
        letterboxes): the engine's profile covers them (`network_min_hw`)."""
        return self.network_min_hw is not None and self.network_min_hw != self.info.input_hw

    @property
    def network_dtype(self) -> Any:
        return self.input_torch_dtype()

    def replica(self, gpu: int) -> TensorRTBackend:
        """Itself on its own GPU; elsewhere the same plan deserialized on `gpu` (plans are per
        GPU model, and a node's GPUs are one model)."""
        if gpu == self._device:
            return self
        return TensorRTBackend(self.plan, device=gpu)

    def network_for_batch(self, batch: int) -> TensorRTGraphNetwork:
        """`network_for` at the model's input size."""
        return self.network_for(batch, self.info.input_hw)

    def network_for(self, batch: int, input_hw: tuple[int, int]) -> TensorRTGraphNetwork:
        """A network for vdet.gpu.graphs with its OWN execution context (each source's
        runner gets one), for (batch, 3, H, W) input on this backend's GPU. H, W other than the
        model's must lie in the engine's profile (`network_min_hw` up to the model's)."""
        if self.end_to_end:
            raise RuntimeError(f"{self.plan} is end-to-end: the GPU path needs the raw head")
        if not 1 <= batch <= self._max_batch:
            raise ValueError(f"batch {batch} is outside the engine's profile 1..{self._max_batch}")
        hw = (int(input_hw[0]), int(input_hw[1]))
        low = self.network_min_hw
        if hw != self.info.input_hw and not (
            low is not None
            and all(
                lo <= side <= hi for side, lo, hi in zip(hw, low, self.info.input_hw, strict=True)
            )
        ):
            raise ValueError(
                f"input {hw} is outside the engine's profile "
                f"({low or self.info.input_hw} to {self.info.input_hw}); rebuild the engine"
            )
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self!r} is closed")
            (output,) = self._outputs
            return TensorRTGraphNetwork(
                self._trt,
                self.execution_context,
                self._engine,
                self._input,
                output,
                batch,
                hw,
                self._device,
                on_first_run=self.save_runtime_cache,
            )

    def close(self) -> None:
        if not self._closed:
            self.save_runtime_cache()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            lanes, self._lanes = self._lanes, []
        rt = runtime()
        for lane in lanes:
            for ptr, _ in lane.buffers.values():
                cuda_call(rt.cudaFree(ptr), "cudaFree")
            cuda_call(rt.cudaStreamDestroy(lane.stream), "cudaStreamDestroy")
            lane.context = None
        self._runtime_config = None
        self._runtime_cache = None
        self._engine = None
        self._runtime = None


def _torch_dtype(trt: Any, dtype: Any) -> Any:
    import torch

    table = {trt.DataType.FLOAT: torch.float32, trt.DataType.HALF: torch.float16}
    if dtype not in table:
        raise RuntimeError(f"the GPU path handles FP32 and FP16 engine I/O, not {dtype}")
    return table[dtype]


class TensorRTGraphNetwork:
    """One execution context as a `vdet.gpu.graphs.Network`: reads the runner's static
    input tensor in place and writes the raw head into an output tensor it owns, enqueued with
    `execute_async_v3` on the caller's current torch stream. Replays of a CUDA graph captured
    around a call re-run TensorRT's kernels on the same addresses, which is why the addresses
    are set on every call (a host-side setting, never part of the graph) and the runner warms
    up with an eager call before capturing, as TensorRT's documentation asks. On TensorRT for
    RTX that eager call is also when the JIT compiles this shape's kernels; `on_first_run` then
    persists the runtime cache. The runner's decode + NMS kernel follows the enqueue on the
    same stream, so both land in the one graph.
    """

    def __init__(
        self,
        trt: Any,
        new_context: Any,
        engine: Any,
        input_name: str,
        output_name: str,
        batch: int,
        input_hw: tuple[int, int],
        device: int,
        *,
        on_first_run: Any = None,
    ) -> None:
        import torch

        self.input_name, self.output_name = input_name, output_name
        self._on_first_run = on_first_run
        with torch.cuda.device(device):
            context = new_context()
            shape = (batch, 3, *input_hw)
            if not context.set_input_shape(input_name, shape):
                raise RuntimeError(f"the engine does not accept input shape {shape}")
            self.input_dtype = _torch_dtype(trt, engine.get_tensor_dtype(input_name))
            out_shape = tuple(context.get_tensor_shape(output_name))
            out_dtype = _torch_dtype(trt, engine.get_tensor_dtype(output_name))
            self.output = torch.empty(out_shape, dtype=out_dtype, device=f"cuda:{device}")
        self.context = context

    def __call__(self, x: Any) -> Any:
        import torch

        x = x.to(self.input_dtype).contiguous()  # NCHW, the engine's input type
        self.context.set_tensor_address(self.input_name, x.data_ptr())
        self.context.set_tensor_address(self.output_name, self.output.data_ptr())
        stream = torch.cuda.current_stream(x.device).cuda_stream
        if not self.context.execute_async_v3(stream):
            raise RuntimeError("TensorRT execute_async_v3 failed (see the TensorRT log)")
        if self._on_first_run is not None and not torch.cuda.is_current_stream_capturing():
            first, self._on_first_run = self._on_first_run, None
            torch.cuda.current_stream(x.device).synchronize()  # the JIT has finished
            first()
        return self.output


def _model_info(plan: Path, manifest: EngineManifest) -> ModelInfo:
    """The model signature the manifest recorded from the ONNX the engine was built from."""
    model = manifest.model
    try:
        names = tuple(str(n) for n in model["names"])
        H, W = (int(v) for v in model["input_hw"])
        return ModelInfo(
            path=Path(manifest.onnx_path) if manifest.onnx_path else plan,
            names=names,
            input_hw=(H, W),
            num_classes=len(names),
            batch=model.get("batch"),
            sha256=str(model.get("source_onnx_sha256", manifest.key.onnx_sha256)),
            stride=int(model.get("stride", STRIDE)),
            num_anchors=model.get("num_anchors"),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise EngineMismatchError(
            f"{plan}: the manifest does not describe the model ({exc}); rebuild the engine"
        ) from exc


def _engine_settings(engine: EngineSettings | None) -> EngineSettings:
    from vdet.config.base import ConfigError
    from vdet.config.engine import EngineSettings
    from vdet.config.settings import load_settings

    if engine is not None:
        return engine
    try:
        return load_settings().engine
    except ConfigError as exc:
        log.warning("using default engine settings: %s", exc)
        return EngineSettings()


def create_tensorrt_backend(
    model_path: str | os.PathLike[str],
    *,
    engine: EngineSettings | None = None,
    device: int = 0,
    build_in_background: bool | None = None,
    flavour: str = TENSORRT.flavour,
) -> InferenceBackend:
    """The `tensorrt` (and, with `flavour`, `tensorrt-rtx`) factory: a plan as given, or the
    cached engine of an ONNX model.

    For an ONNX model the engine is looked up in `engine.cache_dir` under this machine's key
    (TensorRT for RTX: a portable plan whose targets are this GPU's compute capability, so a
    plan built ahead of time with `vdet engine build --target` is found); a missing or
    mismatching one is built, in the background while the torch backend on CUDA (else ONNX
    Runtime) serves when `build_in_background` (default: `engine.build_in_background`).
    """
    from vdet.tensorrt.build import BuildOptions, engine_request

    lib = library(flavour)
    path = Path(model_path)
    if path.suffix.lower() in PLAN_SUFFIXES:
        return TensorRTBackend(path, device=device)
    settings = _engine_settings(engine)
    why_not = unavailable_reason(lib, device)
    if why_not is not None:
        raise RuntimeError(
            f"the {lib.flavour} backend needs the {lib.module} package and a GPU it runs on: "
            f"{why_not}"
        )
    try:
        from vdet.config.settings import load_settings

        detection = load_settings().detection
    except Exception:  # thresholds only matter for plugin_nms; defaults then
        detection = None
    options = BuildOptions.from_settings(settings, detection)
    request = engine_request(path, options, settings.cache_dir, device=device, lib=lib)
    cache = EngineCache(settings.cache_dir)
    try:
        cached = request.lookup(cache)
    except EngineMismatchError as exc:
        log.warning("%s; it will be rebuilt", exc)
        cached = None
    if cached is not None:
        return TensorRTBackend(cached.plan, device=device)

    def build() -> InferenceBackend:
        built: CachedEngine = request.get_or_build(cache)
        return TensorRTBackend(built.plan, device=device)

    if build_in_background is None:
        build_in_background = settings.build_in_background
    if not build_in_background:
        return build()
    from vdet.inference.backends.handoff import serve_while_building

    fallback = _serve_meanwhile(path, device)
    log.info(
        "no %s engine for %s yet: serving on %s while it builds", lib.title, path, fallback.name
    )
    swappable, _ = serve_while_building(fallback, build)
    return swappable


def _serve_meanwhile(path: Path, device: int) -> InferenceBackend:
    """What serves while an engine builds: torch on this GPU where it can, else ONNX Runtime."""
    from vdet.inference.backends.onnxruntime import OnnxRuntimeBackend
    from vdet.inference.backends.torch import torch_cuda_available

    if torch_cuda_available():
        try:
            from vdet.inference.backends.torch import TorchBackend

            return TorchBackend(path, device=f"cuda:{device}")
        except Exception as exc:
            log.warning("torch cannot serve %s while the engine builds (%s)", path, exc)
    return OnnxRuntimeBackend(path)


def create_tensorrt_rtx_backend(
    model_path: str | os.PathLike[str], **options: Any
) -> InferenceBackend:
    """The `tensorrt-rtx` factory (see `create_tensorrt_backend`)."""
    return create_tensorrt_backend(model_path, flavour=TENSORRT_RTX.flavour, **options)


def _accepts(path: Path) -> bool:
    return path.suffix.lower() in PLAN_SUFFIXES or path.suffix.lower() == ".onnx"


register_backend(
    BackendSpec(
        kind=TENSORRT.flavour,
        factory=create_tensorrt_backend,
        priority=300,
        is_available=tensorrt_available,
        accepts=_accepts,
        unavailable_reason=lambda: unavailable_reason(TENSORRT) or "",
    )
)
register_backend(
    BackendSpec(
        kind=TENSORRT_RTX.flavour,
        factory=create_tensorrt_rtx_backend,
        priority=290,
        is_available=tensorrt_rtx_available,
        accepts=_accepts,
        unavailable_reason=lambda: unavailable_reason(TENSORRT_RTX) or "",
    )
)

__all__ = [
    "CudaError",
    "TensorRTBackend",
    "create_tensorrt_backend",
    "create_tensorrt_rtx_backend",
    "plan_refusals",
    "runtime_cache_path",
    "tensorrt_available",
    "tensorrt_rtx_available",
    "unavailable_reason",
]
