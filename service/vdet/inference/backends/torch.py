"""PyTorch on CUDA: the ONNX model as plain torch modules, FP16, channels_last, CUDA graphs.

This module owns turning a detection ONNX file into a torch module that CUDA graphs can capture
(`load_onnx_network`) and `TorchBackend`, the `InferenceBackend` around it (kind `torch`,
priority 200: used by `auto` when CUDA is present and TensorRT is not). It must not preprocess
or postprocess; the GPU-resident per-frame pipeline (NV12 in, detections out) is
vdet.gpu.graphs, which runs the networks this module builds (`TorchBackend.network`).

Why onnx2torch: the deployable artifact is the ONNX file (the same one ONNX Runtime and
TensorRT read), and onnx2torch turns it into an `fx.GraphModule` of ordinary torch modules
(Conv2d, MaxPool2d, elementwise ops), with no runtime of its own. Those launch ordinary CUDA
kernels that `torch.cuda.graphs` captures, run in FP16 with channels_last like any torch model,
and need no compiler at start-up. Alternatives considered: ONNX Runtime's CUDA execution
provider (its own allocator and streams; capture only through its own `enable_cuda_graph` with
bound I/O, and the CPU wheel is what ships); rebuilding the Ultralytics model from a `.pt`
(needs the AGPL package at serving time and the checkpoint, not the artifact we ship);
`torch.compile` (minutes of compile per shape for about the same speed as a CUDA graph);
TensorRT (the tensorrt backend, where TensorRT is installed).

What makes the converted graph capturable, done once at load: the input is fixed to (batch, 3,
H, W) and ONNX Runtime's basic optimisations fold the shape arithmetic of dynamic exports
(Shape -> Gather -> Range -> ...) into constants; onnx2torch then still reads Reshape shapes,
Split sizes, Slice bounds and Resize scales from tensors at run time (`.tolist()`), so those
constants stay on the host (reading them costs no device sync and capture bakes them in), and
Slice is replaced by plain tuple indexing. onnx2torch imports torchvision for its NMS and
RoiAlign converters only; where torchvision is missing (the GPU image) a placeholder stands in
that fails if such an op is ever converted.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
import tempfile
import threading
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import onnx

from vdet.core.model import ModelInfo, load_model_info
from vdet.core.types import FloatArray
from vdet.inference.backends import BackendSpec, register_backend
from vdet.inference.backends.base import InferenceBackend

if TYPE_CHECKING:  # torch_layers imports torch, which the CPU image does not have
    from vdet.inference.backends.torch_layers import LayerKernels

log = logging.getLogger(__name__)

# onnx2torch modules whose tensor arguments (after the first) are only read on the host.
_HOST_ARGUMENT_MODULES = frozenset(
    {
        "OnnxReshape",
        "OnnxSplit13",
        "OnnxSplit",
        "OnnxResize",
        "OnnxExpand",
        "OnnxTile",
        "OnnxConstantOfShape",
        "OnnxRange",
        "OnnxUnsqueezeDynamicAxes",
        "OnnxSqueezeDynamicAxes",
        "OnnxPadDynamic",
        "OnnxTopK",
    }
)


def torch_cuda_available() -> bool:
    """torch is installed and sees a CUDA device (imports torch only if it is installed)."""
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def import_onnx2torch() -> Any:
    """Import onnx2torch, standing in for torchvision when it is not installed (see module doc)."""
    try:
        return importlib.import_module("onnx2torch")
    except ModuleNotFoundError as exc:
        if exc.name != "torchvision":
            raise
    placeholder = types.ModuleType("torchvision")
    ops = types.ModuleType("torchvision.ops")

    def unavailable(*args: object, **kwargs: object) -> object:
        raise RuntimeError("torchvision is not installed; this ONNX op needs it in onnx2torch")

    for name in ("nms", "roi_align", "box_convert", "batched_nms"):
        setattr(ops, name, unavailable)
    placeholder.ops = ops  # type: ignore[attr-defined]
    sys.modules["torchvision"], sys.modules["torchvision.ops"] = placeholder, ops
    try:
        for name in [m for m in sys.modules if m.startswith("onnx2torch")]:
            del sys.modules[name]
        return importlib.import_module("onnx2torch")
    finally:
        # Only onnx2torch keeps the placeholder; nobody else should mistake it for torchvision.
        del sys.modules["torchvision"], sys.modules["torchvision.ops"]


def fold_static_onnx(
    model: onnx.ModelProto, batch: int, input_hw: tuple[int, int]
) -> onnx.ModelProto:
    """Fix the input to (batch, 3, H, W) and fold everything that shape makes constant.

    ONNX Runtime's basic level only rewrites with standard ONNX ops (constant folding,
    redundant-node removal, Conv fusions), so the result is still a plain ONNX model.
    """
    import onnxruntime as ort

    model = onnx.ModelProto.FromString(model.SerializeToString())
    weights = {init.name for init in model.graph.initializer}
    (graph_input,) = [v for v in model.graph.input if v.name not in weights]
    for dim, size in zip(
        graph_input.type.tensor_type.shape.dim, (batch, 3, *input_hw), strict=True
    ):
        dim.ClearField("dim_param")
        dim.dim_value = int(size)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    with tempfile.TemporaryDirectory(prefix="vdet-fold-") as folder:
        folded = os.path.join(folder, "folded.onnx")
        options.optimized_model_filepath = folded
        ort.InferenceSession(
            model.SerializeToString(), sess_options=options, providers=["CPUExecutionProvider"]
        )
        return onnx.load(folded)


def _host_constant_args(module: Any) -> int:
    """Keep tensor constants that onnx2torch only reads on the host out of `.to(device)`.

    A get_attr constant whose every use is a non-first argument of one of the host-reading
    modules becomes a plain (unregistered) attribute: `.to()` / `.half()` leave it on the CPU.
    Returns how many constants moved.
    """
    import torch

    graph = module.graph
    moved = 0
    for node in list(graph.nodes):
        if node.op != "get_attr":
            continue
        users = list(node.users)
        if not users or not all(_reads_on_host(module, user, node) for user in users):
            continue
        owner_path, _, name = node.target.rpartition(".")
        owner = module.get_submodule(owner_path) if owner_path else module
        value = getattr(owner, name)
        if not isinstance(value, torch.Tensor):
            continue
        constant = value.detach().to("cpu").clone()
        if name in owner._buffers:
            del owner._buffers[name]
        elif name in owner._parameters:
            del owner._parameters[name]
        object.__setattr__(owner, name, constant)
        moved += 1
    return moved


def _reads_on_host(module: Any, user: Any, constant: Any) -> bool:
    if user.op != "call_module":
        return False
    kind = type(module.get_submodule(user.target)).__name__
    if kind == "OnnxSlice":
        return True
    if kind not in _HOST_ARGUMENT_MODULES:
        return False
    return bool(user.args) and user.args[0] is not constant


def _make_static_slice_module(index: tuple[slice, ...]) -> Any:
    import torch

    class StaticSlice(torch.nn.Module):
        """Tuple indexing with constant bounds: onnx2torch's Slice without its list-indexing
        deprecation warning and its host reads on every call."""

        def __init__(self) -> None:
            super().__init__()
            self.index = index

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x[self.index]

    return StaticSlice()


def _static_slices(module: Any) -> int:
    """Replace onnx2torch Slice modules whose bounds are constants with `x[tuple(slices)]`."""
    graph = module.graph
    replaced = 0
    for node in list(graph.nodes):
        if node.op != "call_module":
            continue
        if type(module.get_submodule(node.target)).__name__ != "OnnxSlice":
            continue
        args = list(node.args) + [None] * (5 - len(node.args))
        data, starts, ends, axes, steps = args[:5]
        values: list[list[int] | None] = []
        for arg in (starts, ends, axes, steps):
            if arg is None:
                values.append(None)
                continue
            if getattr(arg, "op", None) != "get_attr":
                break
            values.append(np.asarray(_attr(module, arg.target)).astype(np.int64).tolist())
        else:
            start_v, end_v, axes_v, steps_v = values
            assert start_v is not None and end_v is not None
            axes_list = list(range(len(start_v))) if axes_v is None else axes_v
            steps_list = [1] * len(start_v) if steps_v is None else steps_v
            if any(a < 0 for a in axes_list) or any(s < 1 for s in steps_list):
                continue  # keep onnx2torch's general module for negative axes or steps
            index = [slice(None)] * (max(axes_list) + 1)
            for a, s, e, st in zip(axes_list, start_v, end_v, steps_list, strict=True):
                index[a] = slice(s, e, st)
            name = f"vdet_static_slice_{replaced}"
            module.add_submodule(name, _make_static_slice_module(tuple(index)))
            with graph.inserting_after(node):
                new = graph.call_module(name, (data,))
            node.replace_all_uses_with(new)
            graph.erase_node(node)
            replaced += 1
    graph.eliminate_dead_code()
    module.recompile()
    return replaced


def _fuse_silu(module: Any) -> int:
    """Replace each `x * sigmoid(x)` (ONNX has no SiLU before opset 22; YOLOv8 exports it as
    Sigmoid + Mul) with one `SiLU`: a kernel and a pass over the activation less each time,
    about a quarter of the demo network's kernels, which a CUDA graph then has fewer of to
    launch. Only where the sigmoid feeds nothing else. Returns how many were fused."""
    import torch

    graph = module.graph
    fused = 0
    for node in list(graph.nodes):
        if node.op != "call_module" or not _is_module(module, node, "OnnxBinaryMathOperation"):
            continue
        if getattr(module.get_submodule(node.target), "math_op_function", None) is not torch.mul:
            continue
        if len(node.args) != 2 or node.kwargs:
            continue
        first, second = node.args
        for gate, value in ((second, first), (first, second)):
            if (
                getattr(gate, "op", None) == "call_module"
                and _is_module(module, gate, "Sigmoid")
                and len(gate.args) == 1
                and gate.args[0] is value
                and len(gate.users) == 1
            ):
                break
        else:
            continue
        name = f"vdet_silu_{fused}"
        module.add_submodule(name, torch.nn.SiLU())
        with graph.inserting_after(node):
            silu = graph.call_module(name, (value,))
        node.replace_all_uses_with(silu)
        graph.erase_node(node)
        graph.erase_node(gate)
        fused += 1
    graph.eliminate_dead_code()
    module.delete_all_unused_submodules()
    module.recompile()
    return fused


def _is_module(module: Any, node: Any, kind: str) -> bool:
    return type(module.get_submodule(node.target)).__name__ == kind


def _attr(module: Any, target: str) -> Any:
    owner_path, _, name = target.rpartition(".")
    owner = module.get_submodule(owner_path) if owner_path else module
    return getattr(owner, name)


def load_onnx_network(
    path: str | os.PathLike[str],
    *,
    batch: int,
    input_hw: tuple[int, int],
    device: str = "cuda",
    fp16: bool = True,
    channels_last: bool = True,
    layer_kernels: LayerKernels | Literal["auto", "off"] = "auto",
) -> Any:
    """An eval-mode torch module for a detection ONNX file at a fixed input (batch, 3, H, W).

    FP16 (`fp16`) weights and input; `channels_last` weights (feed it channels_last input for
    the fast convolutions). The module returns the raw head (batch, 4 + nc, N) in its dtype.
    `layer_kernels`: conv bias + SiLU and max pools through vdet's own kernels
    (vdet.inference.backends.torch_layers): "auto" does so on a CUDA device in FP16 and
    channels_last where the kernels compile (cuda-python), "off" never, or the kernels to use.
    """
    import torch

    onnx2torch = import_onnx2torch()
    folded = fold_static_onnx(onnx.load(str(path)), batch, input_hw)
    module = onnx2torch.convert(folded)
    _static_slices(module)
    _fuse_silu(module)
    kernels = (
        _layer_ops(torch.device(device), fp16 and channels_last)
        if layer_kernels == "auto"
        else None
        if layer_kernels == "off"
        else layer_kernels
    )
    if kernels is not None:
        from vdet.inference.backends.torch_layers import use_layer_kernels

        use_layer_kernels(module, kernels)
    _host_constant_args(module)
    module = module.eval().requires_grad_(False)
    if fp16:
        module = module.half()
    module = module.to(device)
    if channels_last:
        module = module.to(memory_format=torch.channels_last)
    return module


_LAYER_OPS: dict[int, LayerKernels] = {}
_LAYER_OPS_LOCK = threading.Lock()


def _layer_ops(device: Any, fp16_channels_last: bool) -> LayerKernels | None:
    """The layer kernels for `device` (one per GPU, shared by its networks), or None where
    they do not apply (not CUDA, not FP16 channels_last) or cannot run (no cuda-python)."""
    if device.type != "cuda" or not fp16_channels_last:
        return None
    from vdet.cuda.launch import KernelError
    from vdet.cuda.layer_ops import LayerOps

    index = device.index if device.index is not None else 0
    with _LAYER_OPS_LOCK:
        found = _LAYER_OPS.get(index)
        if found is None:
            try:
                found = LayerOps(device=index)
            except KernelError as exc:  # no cuda-python or driver: torch's own layers then
                log.warning("layer kernels unavailable on cuda:%d (%s): torch's layers", index, exc)
                return None
            _LAYER_OPS[index] = found
    return found


class TorchBackend(InferenceBackend):
    """The ONNX model as torch modules on one CUDA device, FP16, channels_last, CUDA graph.

    `batch`: images per network call when the file's batch is dynamic (default 1; a fixed
    batch in the file wins); larger `infer` batches are split and the last chunk zero-padded,
    like the onnxruntime backend. `cuda_graph`: capture the network once on static buffers and
    replay it per call (on failure it runs eagerly and calls `on_eager_fallback` per call).
    `infer` is thread-safe (serialised: one set of static buffers). `device="cpu"` runs the
    same converted module on the CPU (FP32 only, for tests and debugging).
    """

    name = "torch"

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        *,
        device: str = "cuda",
        batch: int | None = None,
        fp16: bool = True,
        channels_last: bool = True,
        cuda_graph: bool = True,
        on_eager_fallback: Any = None,
        layer_kernels: bool = True,
    ) -> None:
        import torch

        if batch is not None and (isinstance(batch, bool) or batch < 1):
            raise ValueError(f"batch must be a positive int or None, got {batch!r}")
        self.info: ModelInfo = load_model_info(model_path)
        self._torch_device = torch.device(device)
        cuda = self._torch_device.type == "cuda"
        if cuda and not torch.cuda.is_available():
            raise RuntimeError("TorchBackend needs a CUDA device (torch.cuda.is_available())")
        self.fp16 = fp16 and cuda
        self.channels_last = channels_last
        self.dtype = torch.float16 if self.fp16 else torch.float32
        self._batch = self.info.batch or batch or 1
        self._on_eager_fallback = on_eager_fallback
        self._lock = threading.Lock()
        self._networks_lock = threading.Lock()
        # Whether `network_for` builds networks with vdet's layer kernels (GpuTuning);
        # networks are cached per (batch, shape, this).
        self.layer_kernels = layer_kernels
        self._networks: dict[tuple[int, tuple[int, int], bool], Any] = {}
        self.network: Any = self.network_for_batch(self._batch)
        H, W = self.info.input_hw
        self._input = torch.zeros((self._batch, 3, H, W), dtype=self.dtype, device=device)
        self._output: Any = None
        self._graph: Any = None
        self._stream = torch.cuda.Stream(device=self._torch_device) if cuda else None  # type: ignore[no-untyped-call]
        self.graph_failure: str | None = None
        if cuda and cuda_graph:
            self._capture()
        else:
            self._output = self._forward()

    def network_for_batch(self, batch: int) -> Any:
        """The converted network for a fixed batch at the model's input size (cached)."""
        return self.network_for(batch, self.info.input_hw)

    def network_for(self, batch: int, input_hw: tuple[int, int]) -> Any:
        """The converted network for a fixed (batch, 3, H, W) input (cached per shape: the
        fold bakes the shape in, the anchor grid of a dynamic export included, so each shape
        is a network of its own with its own copy of the weights).

        H, W other than the model's need a model whose height and width are dynamic
        (`rect_networks`), with sides multiples of the stride no larger than the model's.
        """
        hw = (int(input_hw[0]), int(input_hw[1]))
        if hw != self.info.input_hw and not self._takes_network_hw(hw):
            raise ValueError(
                f"{self.info.path} runs at {self.info.input_hw}"
                + (
                    f" or smaller multiples of {self.info.stride}"
                    if self.rect_networks
                    else " only (its height and width are fixed)"
                )
                + f", not {hw}"
            )
        key = (batch, hw, self.layer_kernels)
        with self._networks_lock:
            found = self._networks.get(key)
            if found is None:
                found = load_onnx_network(
                    self.info.path,
                    batch=batch,
                    input_hw=hw,
                    device=str(self._torch_device),
                    fp16=self.fp16,
                    channels_last=self.channels_last,
                    layer_kernels="auto" if self.layer_kernels else "off",
                )
                self._networks[key] = found
        return found

    @property
    def rect_networks(self) -> bool:
        """Whether `network_for` builds networks at rectangular inputs (for the GPU data path):
        the model's height and width are dynamic (`ModelInfo.dynamic_hw`)."""
        return self.info.dynamic_hw

    @property
    def network_dtype(self) -> Any:
        return self.dtype

    @property
    def network_channels_last(self) -> bool:
        return self.channels_last

    def replica(self, gpu: int) -> TorchBackend:
        """Itself on its own GPU; elsewhere the same ONNX converted again on `gpu` (no graph
        of its own: the GPU data path captures its own around `network_for`'s networks)."""
        import torch

        own = self._torch_device
        if own.type == "cuda":
            own_index = own.index if own.index is not None else torch.cuda.current_device()
            if gpu == own_index:
                return self
        return TorchBackend(
            self.info.path,
            device=f"cuda:{gpu}",
            fp16=self.fp16,
            channels_last=self.channels_last,
            cuda_graph=False,
            layer_kernels=self.layer_kernels,
        )

    def _takes_network_hw(self, hw: tuple[int, int]) -> bool:
        stride = self.info.stride
        return self.rect_networks and all(
            0 < side <= limit and side % stride == 0
            for side, limit in zip(hw, self.info.input_hw, strict=True)
        )

    def _forward(self) -> Any:
        import torch

        with torch.inference_mode():
            x = self._input
            if self.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            return self.network(x)

    def _capture(self) -> None:
        import torch

        from vdet.cuda.capture_guard import CUDA_WORK

        assert self._stream is not None
        self._stream.wait_stream(torch.cuda.current_stream(self._torch_device))
        with torch.cuda.stream(self._stream):
            for _ in range(2):
                self._output = self._forward()
        self._stream.synchronize()
        try:
            graph = torch.cuda.CUDAGraph()
            with (
                CUDA_WORK.capture(),
                torch.cuda.graph(graph, stream=self._stream, capture_error_mode="thread_local"),
            ):
                self._output = self._forward()
            self._graph = graph
        except Exception as exc:  # capture raises several types
            self.graph_failure = f"{type(exc).__name__}: {exc}"
            self._graph = None
            self._stream.synchronize()

    @property
    def torch_device(self) -> Any:
        """The torch.device the network runs on."""
        return self._torch_device

    @property
    def gpu_data_path(self) -> bool:
        return self._torch_device.type == "cuda"

    @property
    def device(self) -> str:
        import torch

        if self._torch_device.type != "cuda":
            return f"cpu (torch {torch.__version__}, fp32)"
        name = torch.cuda.get_device_name(self._torch_device)
        mode = "cuda graph" if self._graph is not None else "eager"
        precision = "fp16" if self.fp16 else "fp32"
        return f"{self._torch_device} ({name}, torch {torch.__version__}, {precision}, {mode})"

    @property
    def max_batch(self) -> int | None:
        return self._batch

    def infer(self, batch: FloatArray) -> FloatArray:
        import torch

        batch = self.check_batch(batch)
        outputs = []
        from vdet.cuda.capture_guard import CUDA_WORK

        with self._lock, CUDA_WORK.work():
            if self.network is None:
                raise RuntimeError(f"{self!r} is closed")
            for start in range(0, len(batch), self._batch):
                chunk = batch[start : start + self._batch]
                n = len(chunk)
                host = torch.from_numpy(np.ascontiguousarray(chunk))
                if self._stream is None:
                    self._input[:n].copy_(host)
                    self._input[n:].zero_()
                    self._output = self._forward()
                    raw = self._output[:n].float().numpy()
                else:
                    with torch.cuda.stream(self._stream):
                        self._input[:n].copy_(host)
                        self._input[n:].zero_()
                        if self._graph is not None:
                            self._graph.replay()
                        else:
                            self._output = self._forward()
                            if self._on_eager_fallback is not None:
                                self._on_eager_fallback()
                        raw = self._output[:n].float().cpu().numpy()
                outputs.append(np.asarray(raw, dtype=np.float32))
        raw_all = np.concatenate(outputs, axis=0)
        expected_rows = 4 + self.info.num_classes
        if raw_all.ndim != 3 or raw_all.shape[:2] != (len(batch), expected_rows):
            raise RuntimeError(
                f"{self.info.path}: output shape {raw_all.shape} is not "
                f"({len(batch)}, {expected_rows}, N)"
            )
        return raw_all

    def close(self) -> None:
        with self._lock:
            self._graph = None
            self._output = None
            self.network = None
            self._networks.clear()


def _accepts(path: Path) -> bool:
    return path.suffix.lower() == ".onnx"


register_backend(
    BackendSpec(
        kind=TorchBackend.name,
        factory=TorchBackend,
        priority=200,
        is_available=lambda: (
            torch_cuda_available() and importlib.util.find_spec("onnx2torch") is not None
        ),
        accepts=_accepts,
    )
)
