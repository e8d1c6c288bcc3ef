"""ONNX -> TensorRT plan, for TensorRT 10.8+ / 11.x and TensorRT for RTX 1.7+, into the cache.

This module owns the offline build stage: choosing how the network is typed and what precision
it runs in, the batch optimization profile, the builder settings (workspace limit, optimization
level, a persisted timing cache on full TensorRT, the target compute capabilities on TensorRT for
RTX), loading vdet's plugin library when the graph has our node, reporting parser failures with
the failing nodes' names, recording the layers and precisions of the network it built, and
handing the build to `EngineCache.get_or_build` under the right key. Serving only deserializes
(the tensorrt backend). The two libraries differ only where `vdet.tensorrt.library` says.

Precision (`plan_precision`). TensorRT 11 and TensorRT for RTX have no precision builder flags
and no implicit INT8 calibrators: every network is strongly typed and precision lives in the
ONNX. So:

    ONNX carries     requested       TensorRT 10.x                 TensorRT 11.x, for RTX
    Q/DQ int8        auto | int8     strongly typed                strongly typed
    fp16 compute     auto | fp16     strongly typed                strongly typed
    fp32             auto | fp32     weakly typed, no flags        strongly typed
    fp32             fp16            BuilderFlag.FP16              AutoCast to fp16, then typed
    fp32             int8            refused: run `vdet quantize` (vdet uses no calibrator)

The library-dependent code imports it lazily and uses only documented Python API that exists in
TensorRT 10.8+, 11.x and TensorRT for RTX; everything that decides (precision, profile, key,
targets, error text) is plain Python and tested on the CPU, and TensorRT for RTX, which builds
without a GPU, builds real plans in the CPU tests.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import onnx

from vdet.core.contract import rect_input_hw
from vdet.core.extras import install_hint, needs_extra
from vdet.core.model import ModelError, ModelInfo, file_sha256, load_model_info
from vdet.tensorrt.cache import (
    PORTABLE_GPU,
    CachedEngine,
    EngineCache,
    EngineKey,
    EngineMismatchError,
    OptimizationProfile,
    read_manifest,
    verify_plan,
)
from vdet.tensorrt.library import (
    TENSORRT,
    LibraryError,
    TensorRTLibrary,
    default_library,
    library,
    version_tuple,
)
from vdet.tensorrt.surgery import DecodeNmsAttributes, add_decode_nms_file, plugin_node

if TYPE_CHECKING:
    from vdet.config.engine import EngineSettings
    from vdet.config.streams import DetectionDefaults

log = logging.getLogger(__name__)

Precision = Literal["fp32", "fp16", "int8"]
REQUESTED_PRECISIONS = ("auto", "fp32", "fp16", "int8")
MIN_TENSORRT = TENSORRT.min_version
_QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})


class BuildError(RuntimeError):
    """The engine cannot be built; the message says why and, where it can, what to change."""


class TensorRTUnavailableError(BuildError):
    """TensorRT (or a GPU for it) is not available in this environment."""


# ---- decisions (no TensorRT) ----------------------------------------------------------------


def tensorrt_version_tuple(version: str) -> tuple[int, int]:
    """(major, minor) of a TensorRT version string such as "10.8.0.43"."""
    try:
        return version_tuple(version)
    except LibraryError as exc:
        raise BuildError(f"cannot read the TensorRT version {version!r}") from exc


def onnx_precision(model: onnx.ModelProto) -> Precision:
    """What an ONNX computes in: "int8" (Q/DQ nodes), "fp16" (half tensors or casts), "fp32"."""
    graph = model.graph
    if any(node.op_type in _QDQ_OPS for node in graph.node):
        return "int8"
    half = onnx.TensorProto.FLOAT16
    if any(init.data_type == half for init in graph.initializer):
        return "fp16"
    for node in graph.node:
        if node.op_type == "Cast":
            to = next((a.i for a in node.attribute if a.name == "to"), None)
            if to == half:
                return "fp16"
    values = [*graph.value_info, *graph.input, *graph.output]
    if any(v.type.tensor_type.elem_type == half for v in values):
        return "fp16"
    return "fp32"


@dataclass(frozen=True)
class PrecisionPlan:
    """How to build for a precision on one TensorRT major version (see the module table)."""

    precision: Precision
    strongly_typed: bool
    fp16_flag: bool = False
    convert_fp16: bool = False


def plan_precision(
    tensorrt_major: int,
    requested: str,
    carried: Precision,
    *,
    lib: TensorRTLibrary = TENSORRT,
) -> PrecisionPlan:
    """Decide typing and flags for `lib` at `tensorrt_major`; BuildError when it cannot build."""
    if requested not in REQUESTED_PRECISIONS:
        raise BuildError(f"precision must be one of {REQUESTED_PRECISIONS}, got {requested!r}")
    if tensorrt_major < lib.min_version[0]:
        wanted = ".".join(str(v) for v in lib.min_version)
        raise BuildError(f"{lib.title} {tensorrt_major}.x is too old: vdet needs {wanted} or newer")
    typed_only = lib.always_strongly_typed or tensorrt_major >= 11
    if carried == "int8":
        if requested not in ("auto", "int8"):
            raise BuildError(
                f"this ONNX is quantized (Q/DQ INT8); it builds as int8 only, not {requested}. "
                "Pass the unquantized model for fp32/fp16."
            )
        return PrecisionPlan("int8", strongly_typed=True)
    if carried == "fp16":
        if requested not in ("auto", "fp16"):
            raise BuildError(
                f"this ONNX already computes in fp16; it builds as fp16 only, not {requested}. "
                "Pass the fp32 model for fp32/int8."
            )
        return PrecisionPlan("fp16", strongly_typed=True)
    if requested == "int8":
        raise BuildError(
            "int8 needs a Q/DQ ONNX: run `vdet quantize` on calibration frames and build that "
            "model (TensorRT 11 and TensorRT for RTX have no implicit INT8 calibration, and vdet "
            "does not use 10.x's calibrators either)"
        )
    if requested == "fp16":
        if typed_only:
            return PrecisionPlan("fp16", strongly_typed=True, convert_fp16=True)
        return PrecisionPlan("fp16", strongly_typed=False, fp16_flag=True)
    return PrecisionPlan("fp32", strongly_typed=typed_only)


def rect_profile_hw(
    input_hw: tuple[int, int], stride: int
) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """(min_hw, opt_hw) of the rectangular inputs an engine covers for a model of `input_hw`:
    down to half of each side (rounded up to the stride), so that every frame from 2:1
    landscape to 1:2 portrait runs at its own `rect_input_hw` (a wider one pads up to the
    minimum, at the same scale), tuned for 16:9 landscape, the common camera (384x640 at 640).
    None when the model's sides are not multiples of the stride (no rect input exists).
    """
    if stride < 1 or any(side < stride or side % stride for side in input_hw):
        return None
    low = tuple(-(-(side // 2) // stride) * stride for side in input_hw)
    opt = rect_input_hw((1920, 1080), input_hw, stride)
    return (low[0], low[1]), (max(opt[0], low[0]), max(opt[1], low[1]))


def resolve_profile(model_batch: int | None, requested: OptimizationProfile) -> OptimizationProfile:
    """The profile to build: the model's own batch when it is fixed, else the requested one."""
    if model_batch is None:
        return requested
    if requested != OptimizationProfile.fixed(model_batch):
        log.info(
            "the model has a fixed batch of %d; building for it instead of %s",
            model_batch,
            requested.label,
        )
    return OptimizationProfile.fixed(model_batch)


def format_parser_errors(errors: list[Any]) -> list[str]:
    """One line per TensorRT ParserError: node index, name and operator, then the reason."""
    lines = []
    for error in errors:
        node = _call(error, "node", -1)
        name = _call(error, "node_name", "")
        operator = _call(error, "node_operator", "")
        where = f"node {node}" if node is not None and node >= 0 else "model"
        if name:
            where += f" {name!r}"
        if operator:
            where += f" ({operator})"
        stack = _call(error, "local_function_stack", [])
        if stack:
            where += f" in local function {' > '.join(str(s) for s in stack)}"
        lines.append(
            f"{where}: {_call(error, 'desc', '?')} [{_call(error, 'code', '?')}; "
            f"{_call(error, 'file', '?')}:{_call(error, 'line', '?')} {_call(error, 'func', '')}]"
        )
    return lines


def _call(obj: Any, method: str, default: Any) -> Any:
    function = getattr(obj, method, None)
    if function is None:
        return default
    try:
        return function()
    except Exception:  # a binding without that accessor in this TensorRT version
        return default


# ---- options --------------------------------------------------------------------------------


@dataclass(frozen=True)
class BuildOptions:
    """How to build. `plugin_nms` set: the end-to-end graph with the decode + NMS plugin."""

    precision: str = "auto"
    profile: OptimizationProfile = field(default_factory=lambda: OptimizationProfile(1, 1, 8))
    workspace_mib: int | None = None
    optimization_level: int = 3
    timing_cache: Path | None = None
    plugin_library: Path | None = None
    plugin_nms: DecodeNmsAttributes | None = None
    verbose: bool = False

    def __post_init__(self) -> None:
        if self.precision not in REQUESTED_PRECISIONS:
            raise BuildError(
                f"precision must be one of {REQUESTED_PRECISIONS}, got {self.precision!r}"
            )
        if not 0 <= self.optimization_level <= 5:
            raise BuildError(f"optimization level must be 0-5, got {self.optimization_level}")
        if self.workspace_mib is not None and self.workspace_mib < 1:
            raise BuildError(f"workspace must be positive, got {self.workspace_mib} MiB")

    @classmethod
    def from_settings(
        cls, engine: EngineSettings, detection: DetectionDefaults | None = None
    ) -> BuildOptions:
        """Options from `Settings.engine`; the plugin's thresholds from `Settings.detection`."""
        plugin_nms = None
        if engine.plugin_nms:
            plugin_nms = (
                DecodeNmsAttributes(
                    score_threshold=detection.conf_threshold,
                    iou_threshold=detection.iou_threshold,
                    top_k=detection.top_k,
                    max_det=detection.max_det,
                )
                if detection is not None
                else DecodeNmsAttributes()
            )
        return cls(
            precision=engine.precision,
            profile=OptimizationProfile(engine.min_batch, engine.opt_batch, engine.max_batch),
            workspace_mib=engine.workspace_mib,
            optimization_level=engine.optimization_level,
            timing_cache=engine.timing_cache,
            plugin_library=engine.plugin_library,
            plugin_nms=plugin_nms,
        )


def default_timing_cache(cache_dir: Path, key: EngineKey) -> Path:
    """One timing cache per GPU model and TensorRT version (it is specific to both).

    Full TensorRT only: TensorRT for RTX has no timing cache (its APIs are no-ops there).
    """
    slot = key.slot("timing").split(".")[1]  # "<gpu>-sm<cc>"
    return cache_dir / f"timing.{slot}.trt{key.tensorrt_version}.cache"


# ---- requests: the key and the build function for one model ---------------------------------


@dataclass(frozen=True)
class EngineRequest:
    """Everything `EngineCache` needs for one model: key, slot stem and the build function."""

    source: Path
    info: ModelInfo
    key: EngineKey
    stem: str
    plan: PrecisionPlan
    options: BuildOptions
    prepared_onnx: Path
    workdir: Path
    timing_cache: Path | None
    device: int = 0
    library: TensorRTLibrary = TENSORRT

    def model_metadata(self) -> dict[str, Any]:
        return {
            "names": list(self.info.names),
            "input_hw": list(self.info.input_hw),
            "stride": self.info.stride,
            "num_anchors": self.info.num_anchors,
            "batch": self.info.batch,
            "source_onnx_sha256": self.info.sha256,
            "plugin_nms": asdict(self.options.plugin_nms) if self.options.plugin_nms else None,
        }

    def lookup(self, cache: EngineCache) -> CachedEngine | None:
        """The cached plan for this request, None when there is none; a mismatch raises."""
        return cache.lookup(self.key, self.stem)

    def get_or_build(self, cache: EngineCache) -> CachedEngine:
        return cache.get_or_build(
            self.key,
            self.stem,
            self.build,
            onnx_path=self.source,
            model=self.model_metadata(),
        )

    def build(self, plan_path: Path) -> dict[str, Any]:
        """Build the plan into `plan_path` (the cache's temporary file); return its details."""
        onnx_path = self.prepared_onnx
        if self.plan.convert_fp16:
            onnx_path = self._fp16_onnx()
        return build_engine(
            onnx_path,
            plan_path,
            self.options,
            self.plan,
            self.info.input_hw,
            self.key.profile,
            self.timing_cache,
            lib=self.library,
            targets=self.key.targets,
        )

    def _fp16_onnx(self) -> Path:
        """Strongly typed fp16 from an fp32 ONNX: ModelOpt AutoCast (fp32 I/O kept), then the
        surgery again. The converted model is kept in the work folder, keyed by the source's
        sha256, so a rebuild reuses it."""
        try:
            from vdet.modelkit.quantize import convert_fp16
        except ImportError as exc:  # pragma: no cover - the quant extra is missing
            raise BuildError(
                f"fp16 on {self.library.title} converts the ONNX with NVIDIA ModelOpt AutoCast: "
                f"{install_hint('quant')}, or convert it yourself and build that model"
            ) from exc
        half = self.workdir / f"{self.source.stem}.{self.info.sha256[:12]}.fp16.onnx"
        try:
            if not half.is_file():
                half.parent.mkdir(parents=True, exist_ok=True)
                convert_fp16(self.source, half)
        except ImportError as exc:
            raise BuildError(
                needs_extra(f"fp16 on {self.library.title} (NVIDIA ModelOpt AutoCast)", "quant")
            ) from exc
        if self.options.plugin_nms is None:
            return half
        nms = half.with_name(half.stem + ".nms.onnx")
        add_decode_nms_file(half, nms, self.options.plugin_nms)
        return nms


def engine_request(
    source: str | os.PathLike[str],
    options: BuildOptions,
    cache_dir: str | os.PathLike[str],
    *,
    device: int = 0,
    tensorrt_version: str | None = None,
    gpu: tuple[str, str] | None = None,
    lib: TensorRTLibrary | str | None = None,
    targets: tuple[str, ...] | None = None,
) -> EngineRequest:
    """The request for `source` on this machine (its library, version and GPU).

    `lib` is full TensorRT or TensorRT for RTX (default: `default_library()`). `tensorrt_version`
    and `gpu` (name, compute capability) default to the installed library and GPU `device`;
    passing both lets the key be computed without either (tests, planning). `targets` are the
    compute capabilities a TensorRT-for-RTX plan is built for, on a machine with or without a
    GPU (default: GPU `device`'s); full TensorRT builds for the GPU it runs on only.
    """
    source, cache_dir = Path(source), Path(cache_dir)
    try:
        lib = _resolve_library(lib)
    except LibraryError as exc:
        raise TensorRTUnavailableError(str(exc)) from exc
    try:
        info = load_model_info(source)
    except ModelError as exc:
        raise BuildError(str(exc)) from exc
    if tensorrt_version is None:
        tensorrt_version = str(_load(lib).__version__)
    if options.plugin_nms is not None and not lib.supports_plugins:
        raise BuildError(
            f"{lib.title} ships no plugin headers, so vdet's decode + NMS plugin cannot be built "
            "into its engines; serve the raw-head engine (engine.plugin_nms: false), whose decode "
            "+ NMS runs as vdet's own kernel after the engine in the same CUDA graph"
        )
    gpu = _key_gpu(lib, device, gpu, targets)
    major, minor = tensorrt_version_tuple(tensorrt_version)
    if (major, minor) < lib.min_version:
        wanted = ".".join(str(v) for v in lib.min_version)
        raise BuildError(f"{lib.title} {tensorrt_version} is too old: vdet needs {wanted} or newer")
    model = onnx.load(str(source), load_external_data=False)
    plan = plan_precision(major, options.precision, onnx_precision(model), lib=lib)
    profile = resolve_profile(info.batch, options.profile)
    rect = rect_profile_hw(info.input_hw, info.stride) if info.dynamic_hw else None
    if rect is not None and options.plugin_nms is None:
        # The raw-head engine of the GPU data path: every stream runs at its rectangular input.
        profile = replace(profile, min_hw=rect[0], opt_hw=rect[1])

    workdir = cache_dir / "onnx"
    prepared = source
    plugin_sha = None
    stem = source.stem
    if options.plugin_nms is not None:
        from vdet.tensorrt.plugin_library import find_plugin_library, library_sha256

        attrs = json.dumps(asdict(options.plugin_nms), sort_keys=True).encode()
        tag = hashlib.sha256(info.sha256.encode() + attrs).hexdigest()[:12]
        prepared = workdir / f"{source.stem}.{tag}.nms.onnx"
        if not prepared.is_file():
            add_decode_nms_file(source, prepared, options.plugin_nms)
        plugin_sha = library_sha256(find_plugin_library(options.plugin_library))
        stem = f"{source.stem}.nms"
    key = EngineKey(
        gpu_name=gpu[0],
        compute_capability=gpu[1],
        tensorrt_version=tensorrt_version,
        plugin_sha256=plugin_sha,
        onnx_sha256=file_sha256(prepared),
        precision=plan.precision,
        profile=profile,
        flavour=lib.flavour,
    )
    timing = None
    if lib.has_timing_cache:
        timing = options.timing_cache or default_timing_cache(cache_dir, key)
    return EngineRequest(
        source=source,
        info=info,
        key=key,
        stem=stem,
        plan=plan,
        options=options,
        prepared_onnx=prepared,
        workdir=workdir,
        timing_cache=timing,
        device=device,
        library=lib,
    )


def _resolve_library(lib: TensorRTLibrary | str | None) -> TensorRTLibrary:
    if lib is None:
        return default_library()
    if isinstance(lib, str):
        return library(lib)
    return lib


def _key_gpu(
    lib: TensorRTLibrary,
    device: int,
    gpu: tuple[str, str] | None,
    targets: tuple[str, ...] | None,
) -> tuple[str, str]:
    """The key's (gpu_name, compute capability): the GPU itself, or a portable target list."""
    if lib.builds_without_gpu:
        if not targets:
            if gpu is None:
                gpu = _this_gpu(
                    device,
                    f"{lib.title} builds on a machine without a GPU for named targets only: "
                    "pass --target (e.g. --target sm86,sm89)",
                )
            targets = (gpu[1],)
        try:
            lib.check_targets(targets)
        except LibraryError as exc:
            raise BuildError(str(exc)) from exc
        return PORTABLE_GPU, ",".join(sorted(targets, key=version_tuple))
    if gpu is None:
        gpu = _this_gpu(device, f"{lib.title} builds on the GPU it serves")
    if targets and tuple(targets) != (gpu[1],):
        raise BuildError(
            f"{lib.title} builds only for the GPU it runs on ({gpu[0]}, compute capability "
            f"{gpu[1]}), not for {', '.join(targets)}: --target needs TensorRT for RTX "
            f"({install_hint('tensorrt-rtx')})"
        )
    return gpu


def _this_gpu(device: int, why: str) -> tuple[str, str]:
    from vdet.cuda.runtime import CudaError, gpu_identity

    try:
        identity = gpu_identity(device)
    except CudaError as exc:
        raise TensorRTUnavailableError(f"no usable GPU {device} ({exc}); {why}") from exc
    return identity.name, identity.compute_capability


def build_cached(
    source: str | os.PathLike[str],
    options: BuildOptions,
    cache_dir: str | os.PathLike[str],
    *,
    device: int = 0,
    lib: TensorRTLibrary | str | None = None,
    targets: tuple[str, ...] | None = None,
) -> CachedEngine:
    """Reuse the cached engine for `source`, or build it (a mismatching plan is rebuilt)."""
    request = engine_request(source, options, cache_dir, device=device, lib=lib, targets=targets)
    return request.get_or_build(EngineCache(cache_dir))


# ---- the TensorRT build ---------------------------------------------------------------------


def tensorrt_installed() -> bool:
    """Whether full TensorRT's Python package is installed, without importing it.

    A namespace package does not count: any folder called tensorrt/ on sys.path (a test folder
    of that name, with tests/ on the path) would otherwise pass for TensorRT.
    """
    return TENSORRT.installed()


def any_tensorrt_installed() -> bool:
    """Whether full TensorRT or TensorRT for RTX is installed."""
    return any(lib.installed() for lib in (TENSORRT, library("tensorrt-rtx")))


def _load(lib: TensorRTLibrary) -> Any:
    """The library's module; TensorRTUnavailableError (a BuildError) when it cannot be used."""
    try:
        return lib.load()
    except LibraryError as exc:
        raise TensorRTUnavailableError(str(exc)) from exc


def _tensorrt() -> Any:
    return _load(TENSORRT)


def _make_logger(trt: Any, verbose: bool) -> Any:
    """A TensorRT logger that forwards to logging and keeps the errors for BuildError."""

    class _Logger(trt.ILogger):  # type: ignore[misc]
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.errors: list[str] = []

        def log(self, severity: Any, msg: str) -> None:
            levels = trt.ILogger.Severity
            if severity in (levels.INTERNAL_ERROR, levels.ERROR):
                self.errors.append(msg)
                log.error("TensorRT: %s", msg)
            elif severity == levels.WARNING:
                log.warning("TensorRT: %s", msg)
            elif verbose:
                log.info("TensorRT: %s", msg)

    return _Logger()


def build_engine(
    onnx_path: Path,
    plan_path: Path,
    options: BuildOptions,
    plan: PrecisionPlan,
    input_hw: tuple[int, int],
    profile: OptimizationProfile,
    timing_cache: Path | None,
    *,
    lib: TensorRTLibrary = TENSORRT,
    targets: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Parse `onnx_path`, build, write the plan to `plan_path`; return the build's details.

    `targets` are TensorRT for RTX's compute capabilities (full TensorRT builds for its GPU).
    """
    trt = _load(lib)
    version = str(trt.__version__)
    strongly_typed = plan.strongly_typed or lib.strongly_typed(version)
    logger = _make_logger(trt, options.verbose)
    model = onnx.load(str(onnx_path), load_external_data=False)
    plugin_library = None
    if plugin_node(model) is not None:
        if not lib.supports_plugins:
            raise BuildError(f"{onnx_path} has vdet's plugin node, which {lib.title} cannot load")
        from vdet.tensorrt.plugin_library import load_into_tensorrt

        plugin_library = load_into_tensorrt(trt, options.plugin_library)

    start = time.monotonic()
    builder = trt.Builder(logger)
    flags = 0
    if plan.strongly_typed and not lib.strongly_typed(version):
        # 11.x and TensorRT for RTX are always strongly typed (the flag is deprecated); 10.x
        # needs it.
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = [parser.get_error(i) for i in range(parser.num_errors)]
        lines = format_parser_errors(errors) or logger.errors or ["no error reported"]
        raise BuildError(
            f"{lib.title} {version} could not parse {onnx_path}:\n  " + "\n  ".join(lines)
        )

    config = builder.create_builder_config()
    if options.workspace_mib is not None:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options.workspace_mib << 20)
    config.builder_optimization_level = options.optimization_level
    # Layer names, types and precisions in the plan, for `vdet engine inspect` on a GPU.
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    if plan.fp16_flag:
        config.set_flag(trt.BuilderFlag.FP16)
    try:
        lib.set_build_targets(trt, config, targets)
    except LibraryError as exc:
        raise BuildError(str(exc)) from exc

    shapes = _add_profile(trt, builder, network, config, input_hw, profile)
    cache_loaded = _use_timing_cache(config, timing_cache) if lib.has_timing_cache else False
    layers = network_layers(network)

    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        detail = "\n  ".join(logger.errors[-10:]) or f"see {lib.title}'s log above"
        raise BuildError(f"{lib.title} {version} failed to build {onnx_path}:\n  {detail}")
    plan_path.parent.mkdir(parents=True, exist_ok=True)
    with open(plan_path, "wb") as f:
        f.write(serialized)
    if timing_cache is not None and lib.has_timing_cache:
        _save_timing_cache(config, timing_cache)
    return {
        "library": lib.flavour,
        "tensorrt_version": version,
        "targets": list(targets) if lib.builds_without_gpu else None,
        "network": layers,
        "onnx": str(onnx_path),
        "strongly_typed": strongly_typed,
        "fp16_flag": plan.fp16_flag,
        "converted_fp16": plan.convert_fp16,
        "precision": plan.precision,
        "optimization_level": options.optimization_level,
        "workspace_mib": options.workspace_mib,
        "input_shapes": shapes,
        "timing_cache": str(timing_cache) if timing_cache and lib.has_timing_cache else None,
        "timing_cache_reused": cache_loaded,
        "plugin_library": str(plugin_library) if plugin_library else None,
        "seconds": round(time.monotonic() - start, 3),
    }


def network_layers(network: Any) -> dict[str, Any]:
    """What the builder was given, as TensorRT typed it: layer count, layers per type, the
    number of layer outputs per data type, and the network's I/O types.

    Read from the network definition before the build, so it needs no GPU; the built engine's
    own layer list (fusions, chosen kernels) needs a GPU to deserialize (`vdet engine inspect`).
    """
    per_type: dict[str, int] = {}
    per_dtype: dict[str, int] = {}
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        kind = str(layer.type).rsplit(".", 1)[-1]
        per_type[kind] = per_type.get(kind, 0) + 1
        for j in range(layer.num_outputs):
            dtype = str(layer.get_output_type(j)).rsplit(".", 1)[-1]
            per_dtype[dtype] = per_dtype.get(dtype, 0) + 1
    inputs = [network.get_input(i) for i in range(network.num_inputs)]
    outputs = [network.get_output(i) for i in range(network.num_outputs)]
    return {
        "layers": int(network.num_layers),
        "layer_types": dict(sorted(per_type.items())),
        "output_dtypes": dict(sorted(per_dtype.items())),
        "inputs": {t.name: str(t.dtype).rsplit(".", 1)[-1] for t in inputs},
        "outputs": {t.name: str(t.dtype).rsplit(".", 1)[-1] for t in outputs},
    }


def _add_profile(
    trt: Any,
    builder: Any,
    network: Any,
    config: Any,
    input_hw: tuple[int, int],
    profile: OptimizationProfile,
) -> dict[str, list[int]]:
    """An optimization profile for the image input when any of its dimensions is dynamic:
    the profile's batches, and its input sizes (`min_hw`, `opt_hw`) up to `input_hw` where it
    has them, else `input_hw` throughout."""
    if network.num_inputs != 1:
        raise BuildError(f"expected one network input, TensorRT sees {network.num_inputs}")
    tensor = network.get_input(0)
    dims = list(tensor.shape)
    H, W = input_hw
    low_hw = profile.min_hw or (H, W)
    opt_hw = profile.opt_hw or (H, W)
    shapes = {
        "min": [profile.min, 3, *low_hw],
        "opt": [profile.opt, 3, *opt_hw],
        "max": [profile.max, 3, H, W],
    }
    for which, shape in shapes.items():
        for fixed, wanted in zip(dims, shape, strict=True):
            if fixed >= 0 and fixed != wanted:
                raise BuildError(
                    f"input {tensor.name!r} is {dims} but the {which} profile shape is {shape}"
                )
    if all(d >= 0 for d in dims):
        return {"static": dims}
    opt_profile = builder.create_optimization_profile()
    opt_profile.set_shape(tensor.name, shapes["min"], shapes["opt"], shapes["max"])
    config.add_optimization_profile(opt_profile)
    return shapes


def _use_timing_cache(config: Any, path: Path | None) -> bool:
    """Start from the persisted timing cache when it fits this GPU; True when it was reused."""
    if path is None:
        return False
    data = path.read_bytes() if path.is_file() else b""
    cache = config.create_timing_cache(data)
    if config.set_timing_cache(cache, False):
        return bool(data)
    log.warning("timing cache %s does not fit this GPU or TensorRT; starting a new one", path)
    config.set_timing_cache(config.create_timing_cache(b""), False)
    return False


def _save_timing_cache(config: Any, path: Path) -> None:
    cache = config.get_timing_cache()
    if cache is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(cache.serialize())
    tmp.replace(path)


# ---- inspect --------------------------------------------------------------------------------


def inspect_plan(
    plan: str | os.PathLike[str],
    *,
    deserialize: Callable[[Path], Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """A plan's manifest and whether its bytes match it; with `deserialize`, its I/O too.

    Needs no TensorRT: the manifest and the sha256 check are plain files. `deserialize`
    (`tensorrt_io` where TensorRT is installed) adds what the engine itself says.
    """
    plan = Path(plan)
    report: dict[str, Any] = {"plan": str(plan)}
    try:
        manifest = verify_plan(plan)
        report["valid"] = True
    except EngineMismatchError as exc:
        report["valid"] = False
        report["problem"] = str(exc)
        try:
            manifest = read_manifest(plan)
        except EngineMismatchError:
            return report
    report["manifest"] = asdict(manifest)
    if deserialize is not None:
        report["engine"] = dict(deserialize(plan))
    return report


def plan_library(plan: Path) -> TensorRTLibrary:
    """The library a plan was built with, from its manifest."""
    return library(read_manifest(plan).key.flavour)


def can_deserialize(plan: Path) -> bool:
    """Whether `tensorrt_io` may try this plan here: its library is installed and a GPU is
    visible (deserializing needs one, even to list the layers)."""
    from vdet.cuda.runtime import gpu_count

    try:
        return plan_library(plan).installed() and gpu_count() > 0
    except (EngineMismatchError, LibraryError):
        return False


def tensorrt_io(plan: Path) -> dict[str, Any]:
    """Deserialize a plan and list its I/O tensors, profiles and layers (needs the plan's library
    and a GPU it runs on)."""
    manifest = read_manifest(plan)
    lib = library(manifest.key.flavour)
    trt = _load(lib)
    logger = _make_logger(trt, verbose=False)
    if manifest.key.plugin_sha256 is not None:
        from vdet.tensorrt.plugin_library import load_for_plan

        load_for_plan(trt, manifest.build.get("plugin_library"), manifest.key.plugin_sha256)
    runtime = trt.Runtime(logger)
    engine = runtime.deserialize_cuda_engine(plan.read_bytes())
    if engine is None:
        raise BuildError(
            f"{lib.title} {trt.__version__} cannot deserialize {plan}: {logger.errors}"
        )
    tensors = []
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        tensors.append(
            {
                "name": name,
                "mode": str(engine.get_tensor_mode(name)),
                "dtype": str(engine.get_tensor_dtype(name)),
                "shape": list(engine.get_tensor_shape(name)),
            }
        )
    inspector = engine.create_engine_inspector()
    layers = json.loads(inspector.get_engine_information(trt.LayerInformationFormat.JSON))
    return {
        "library": lib.flavour,
        "tensorrt_version": trt.__version__,
        "io": tensors,
        "profiles": engine.num_optimization_profiles,
        "layers": layers.get("Layers", layers),
    }
