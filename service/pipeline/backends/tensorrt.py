"""TensorRT: a serialized engine from the engine cache, one execution context per source.

This module owns `TensorRTBackend` (kind `tensorrt`, priority 300: `auto`'s first choice where
`tensorrt` imports and a GPU exists). It deserializes one plan once, then gives every calling
thread (each video source runs its own worker thread) its own `IExecutionContext`, CUDA stream
and device buffers, so sources never wait for each other's copies. `infer` is the host-side
generic contract: float32 NCHW in, the raw head out (`set_input_shape`, `set_tensor_address`,
`execute_async_v3`, then a synchronise). An end-to-end engine (built with the decode + NMS
plugin, `engine.plugin_nms`) has no raw head; `infer_end_to_end` returns its detections.

Engines come from `vdet.engines` (build and cache); this module never builds one itself except
through `EngineRequest.get_or_build`. For an ONNX model without a valid cached engine the
factory either builds first, or (`engine.build_in_background`, the default) serves on ONNX
Runtime and swaps TensorRT in when the engine is ready (`handoff.serve_while_building`).
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ...engines.cache import (
    CachedEngine,
    EngineCache,
    EngineManifest,
    EngineMismatchError,
    verify_plan,
)
from ...engines.gpu import CudaError, cuda_call, gpu_count, gpu_identity, runtime
from ...types import FloatArray
from ..model import ModelInfo
from . import BackendSpec, register_backend
from .base import InferenceBackend

if TYPE_CHECKING:
    from ...config import EngineSettings

log = logging.getLogger(__name__)

PLAN_SUFFIXES = frozenset({".plan", ".engine", ".trt"})
DETECTIONS = "detections"
NUM_DETECTIONS = "num_detections"


def tensorrt_available() -> bool:
    """TensorRT's Python package is installed and the CUDA runtime sees a GPU."""
    from ...engines.build import tensorrt_installed

    return tensorrt_installed() and gpu_count() > 0


@dataclass
class _Lane:
    """One source's execution context, stream and device buffers (sized for the profile max)."""

    context: Any
    stream: Any
    buffers: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (ptr, bytes)


class TensorRTBackend(InferenceBackend):
    """A deserialized TensorRT engine; a context, stream and buffers per calling thread."""

    name = "tensorrt"

    def __init__(self, plan: str | os.PathLike[str], *, device: int = 0) -> None:
        import tensorrt as trt

        from ...engines.build import _make_logger

        self._trt = trt
        plan = Path(plan)
        manifest = verify_plan(plan)
        self._check_here(plan, manifest, device)
        self.manifest = manifest
        self.plan = plan
        self.info = _model_info(plan, manifest)
        self.precision = manifest.key.precision
        self._device = device
        cuda_call(runtime().cudaSetDevice(device), "cudaSetDevice")
        if manifest.key.plugin_sha256 is not None:
            from vdet.plugins.loader import load_for_plan

            load_for_plan(trt, manifest.build.get("plugin_library"), manifest.key.plugin_sha256)
        self._logger = _make_logger(trt, verbose=False)
        self._runtime = trt.Runtime(self._logger)
        self._engine = self._runtime.deserialize_cuda_engine(plan.read_bytes())
        if self._engine is None:
            raise RuntimeError(
                f"TensorRT {trt.__version__} cannot deserialize {plan}: "
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
        self._lock = threading.Lock()
        self._local = threading.local()
        self._lanes: list[_Lane] = []
        self._closed = False

    @staticmethod
    def _check_here(plan: Path, manifest: EngineManifest, device: int) -> None:
        """Refuse a plan built for another GPU model or TensorRT version, with the reason."""
        import tensorrt as trt

        gpu = gpu_identity(device)
        key = manifest.key
        reasons = []
        if key.tensorrt_version != trt.__version__:
            reasons.append(f"built with TensorRT {key.tensorrt_version}, this is {trt.__version__}")
        if (key.gpu_name, key.compute_capability) != (gpu.name, gpu.compute_capability):
            reasons.append(
                f"built for {key.gpu_name} (sm {key.compute_capability}), this is {gpu.name} "
                f"(sm {gpu.compute_capability})"
            )
        if reasons:
            raise EngineMismatchError(
                f"{plan} cannot run here: {'; '.join(reasons)}. Rebuild it: vdet engine build"
            )

    @property
    def device(self) -> str:
        key = self.manifest.key
        version = key.tensorrt_version
        return f"cuda:{self._device} {key.gpu_name} (tensorrt {version}, {self.precision})"

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
            context = self._engine.create_execution_context()
            if context is None:
                raise RuntimeError("TensorRT could not create an execution context (GPU memory?)")
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

    # -- the GPU data path (vdet.gpu_workers) --

    @property
    def device_index(self) -> int:
        return self._device

    def input_torch_dtype(self) -> Any:
        """The torch dtype of the engine's input (FP16 engines built by the builder flag on
        TensorRT 10 keep an FP32 input)."""
        return _torch_dtype(self._trt, self._engine.get_tensor_dtype(self._input))

    def network_for_batch(self, batch: int) -> TensorRTGraphNetwork:
        """A network for vdet.pipeline.gpu_runner with its OWN execution context (each source's
        runner gets one), for (batch, 3, H, W) input on this backend's GPU."""
        if self.end_to_end:
            raise RuntimeError(f"{self.plan} is end-to-end: the GPU path needs the raw head")
        if not 1 <= batch <= self._max_batch:
            raise ValueError(f"batch {batch} is outside the engine's profile 1..{self._max_batch}")
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self!r} is closed")
            (output,) = self._outputs
            return TensorRTGraphNetwork(
                self._engine, self._input, output, batch, self.info.input_hw, self._device
            )

    def close(self) -> None:
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
        self._engine = None
        self._runtime = None


def _torch_dtype(trt: Any, dtype: Any) -> Any:
    import torch

    table = {trt.DataType.FLOAT: torch.float32, trt.DataType.HALF: torch.float16}
    if dtype not in table:
        raise RuntimeError(f"the GPU path handles FP32 and FP16 engine I/O, not {dtype}")
    return table[dtype]


class TensorRTGraphNetwork:
    """One execution context as a `vdet.pipeline.gpu_runner.Network`: reads the runner's static
    input tensor in place and writes the raw head into an output tensor it owns, enqueued with
    `execute_async_v3` on the caller's current torch stream. Replays of a CUDA graph captured
    around a call re-run TensorRT's kernels on the same addresses, which is why the addresses
    are set on every call (a host-side setting, never part of the graph) and the runner warms
    up with an eager call before capturing, as TensorRT's documentation asks.
    """

    def __init__(
        self,
        engine: Any,
        input_name: str,
        output_name: str,
        batch: int,
        input_hw: tuple[int, int],
        device: int,
    ) -> None:
        import tensorrt as trt
        import torch

        self.input_name, self.output_name = input_name, output_name
        with torch.cuda.device(device):
            context = engine.create_execution_context()
            if context is None:
                raise RuntimeError("TensorRT could not create an execution context (GPU memory?)")
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
            stride=int(model.get("stride", 32)),
            num_anchors=model.get("num_anchors"),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise EngineMismatchError(
            f"{plan}: the manifest does not describe the model ({exc}); rebuild the engine"
        ) from exc


def _engine_settings(engine: EngineSettings | None) -> EngineSettings:
    from ...config import ConfigError, EngineSettings, load_settings

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
) -> InferenceBackend:
    """The `tensorrt` factory: a plan as given, or the cached engine of an ONNX model.

    For an ONNX model the engine is looked up in `engine.cache_dir` under this machine's key;
    a missing or mismatching one is built, in the background while ONNX Runtime serves when
    `build_in_background` (default: `engine.build_in_background`).
    """
    from ...engines.build import BuildOptions, engine_request

    path = Path(model_path)
    if path.suffix.lower() in PLAN_SUFFIXES:
        return TensorRTBackend(path, device=device)
    settings = _engine_settings(engine)
    if not tensorrt_available():
        raise RuntimeError("the tensorrt backend needs the tensorrt package and a GPU")
    try:
        from ...config import load_settings

        detection = load_settings().detection
    except Exception:  # thresholds only matter for plugin_nms; defaults then
        detection = None
    options = BuildOptions.from_settings(settings, detection)
    request = engine_request(path, options, settings.cache_dir, device=device)
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
    from .handoff import serve_while_building
    from .onnxruntime import OnnxRuntimeBackend

    log.info("no TensorRT engine for %s yet: serving on ONNX Runtime while it builds", path)
    swappable, _ = serve_while_building(OnnxRuntimeBackend(path), build)
    return swappable


def _accepts(path: Path) -> bool:
    return path.suffix.lower() in PLAN_SUFFIXES or path.suffix.lower() == ".onnx"


register_backend(
    BackendSpec(
        kind=TensorRTBackend.name,
        factory=create_tensorrt_backend,
        priority=300,
        is_available=tensorrt_available,
        accepts=_accepts,
    )
)

__all__ = ["CudaError", "TensorRTBackend", "create_tensorrt_backend", "tensorrt_available"]
