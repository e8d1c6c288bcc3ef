"""Which TensorRT: full TensorRT or TensorRT for RTX, and what differs between the two.

This module owns the small adapter that lets one engine builder, one cache and one backend serve
both NVIDIA libraries. Everything else (parsing ONNX, profiles, the plan, execution contexts,
`execute_async_v3`) is the same Python API in both, so the rest of vdet calls the module this
adapter loads and asks it only about the differences:

    difference                  full TensorRT (`tensorrt`)       TensorRT for RTX (`tensorrt-rtx`)
    Python module               tensorrt                         tensorrt_rtx_bindings
    versions vdet accepts       10.8 and newer (11.x)            1.7 and newer
    where a plan is built       on the GPU it serves             anywhere, even without a GPU,
                                                                 for named compute capabilities
    GPUs a plan runs on         the GPU model it was built on    the targets it was built for
                                                                 (8.0, 8.6, 8.9, 12.x; not
                                                                 Hopper's 9.0)
    typing                      weak (10.x) or strong (11.x)     always strongly typed: fp16 and
                                                                 int8 come from the ONNX
    timing cache                persisted per GPU and version    none (its APIs are no-ops)
    runtime cache               none                             JIT kernels, persisted beside the
                                                                 plan per GPU
    vdet's IPluginV3 plugin     yes (engine.plugin_nms)          no public plugin headers: serving
                                                                 runs our NVRTC decode + NMS after
                                                                 the engine instead

It must not build, cache or serve anything: engines/build.py, engines/cache.py and the tensorrt
backend do, through `TensorRTLibrary`.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from dataclasses import dataclass
from typing import Any, Literal

from vdet.core.extras import install_hint

Flavour = Literal["tensorrt", "tensorrt-rtx"]
FLAVOURS: tuple[Flavour, ...] = ("tensorrt", "tensorrt-rtx")

# TensorRT for RTX's ComputeCapability enum (1.7) names these; Hopper (9.0) and Volta are absent,
# and its runtime refuses a plan on a GPU outside them at deserialize.
RTX_TARGETS: dict[str, str] = {
    "7.5": "SM75",
    "8.0": "SM80",
    "8.6": "SM86",
    "8.9": "SM89",
    "12.0": "SM120",
    "12.1": "SM121",
}


class LibraryError(RuntimeError):
    """The library is missing, too old, or cannot do what was asked; the message says why."""


def version_tuple(version: str) -> tuple[int, int]:
    """(major, minor) of a version string such as "10.8.0.43" or "1.7.1.116"."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        raise LibraryError(f"cannot read the version {version!r}")
    return int(match.group(1)), int(match.group(2))


def parse_targets(text: str) -> tuple[str, ...]:
    """Compute capabilities from `--target`: "sm86,sm89" or "8.6,8.9" -> ("8.6", "8.9")."""
    targets: list[str] = []
    for item in (part.strip().lower() for part in text.split(",")):
        if not item:
            continue
        match = re.fullmatch(r"(?:sm_?)?(\d+)\.?(\d)?", item)
        if match is None or (match.group(2) is None and len(match.group(1)) < 2):
            raise LibraryError(f"target {item!r} is not a compute capability like sm86 or 8.6")
        if match.group(2) is not None:
            major, minor = match.group(1), match.group(2)
        else:
            major, minor = match.group(1)[:-1], match.group(1)[-1]
        cc = f"{int(major)}.{int(minor)}"
        if cc not in targets:
            targets.append(cc)
    if not targets:
        raise LibraryError("no target compute capability given (e.g. --target sm86,sm89)")
    return tuple(sorted(targets, key=version_tuple))


@dataclass(frozen=True)
class TensorRTLibrary:
    """One of the two libraries: how to load it and what it can do (see the module table)."""

    flavour: Flavour
    module: str
    title: str
    min_version: tuple[int, int]
    pip_hint: str
    builds_without_gpu: bool
    always_strongly_typed: bool
    has_timing_cache: bool
    has_runtime_cache: bool
    supports_plugins: bool
    # None: a plan runs on the GPU model it was built on, whichever that is.
    runtime_targets: frozenset[str] | None

    def installed(self) -> bool:
        """Whether the Python package is installed, without importing it.

        A namespace package does not count: a folder called tensorrt/ on sys.path (a test folder
        of that name) would otherwise pass for TensorRT.
        """
        spec = importlib.util.find_spec(self.module)
        return spec is not None and spec.origin is not None

    def load(self) -> Any:
        """The imported Python module, or LibraryError saying how to install it."""
        if not self.installed():
            raise LibraryError(
                f"{self.title}'s Python package is not installed here: {self.pip_hint}"
            )
        trt = importlib.import_module(self.module)
        self.check_version(str(trt.__version__))
        return trt

    def check_version(self, version: str) -> None:
        if version_tuple(version) < self.min_version:
            wanted = ".".join(str(v) for v in self.min_version)
            raise LibraryError(f"{self.title} {version} is too old: vdet needs {wanted} or newer")

    def strongly_typed(self, version: str) -> bool:
        """Whether every network is strongly typed (precision only from the ONNX)."""
        return self.always_strongly_typed or version_tuple(version)[0] >= 11

    def runs_on(self, compute_capability: str) -> bool:
        """Whether this library can run a plan on a GPU of `compute_capability` at all."""
        return self.runtime_targets is None or compute_capability in self.runtime_targets

    def check_targets(self, targets: tuple[str, ...]) -> None:
        """Refuse targets this library cannot build for, naming the ones it can."""
        if self.runtime_targets is None:
            return
        unknown = [t for t in targets if t not in self.runtime_targets]
        if unknown:
            known = ", ".join(sorted(self.runtime_targets, key=version_tuple))
            raise LibraryError(
                f"{self.title} cannot build for compute capability {', '.join(unknown)}; "
                f"it targets {known} (Hopper, 9.0, runs full TensorRT or torch)"
            )

    def set_build_targets(self, trt: Any, config: Any, targets: tuple[str, ...]) -> None:
        """Point the builder at `targets` (TensorRT for RTX); full TensorRT builds for its GPU."""
        if not self.builds_without_gpu:
            return
        self.check_targets(targets)
        config.num_compute_capabilities = len(targets)
        for index, cc in enumerate(targets):
            if not config.set_compute_capability(
                getattr(trt.ComputeCapability, RTX_TARGETS[cc]), index
            ):
                raise LibraryError(f"{self.title} refused compute capability {cc} as a target")

    def execution_context(self, engine: Any, runtime_config: Any | None) -> Any:
        """A new execution context, through the runtime config where the library has one."""
        if runtime_config is None:
            return engine.create_execution_context()
        return engine.create_execution_context(runtime_config)


TENSORRT = TensorRTLibrary(
    flavour="tensorrt",
    module="tensorrt",
    title="TensorRT",
    min_version=(10, 8),
    pip_hint="build engines in NVIDIA's TensorRT or PyTorch container, or `pip install "
    "tensorrt-cu12` from NVIDIA's index (docs/tensorrt.md)",
    builds_without_gpu=False,
    always_strongly_typed=False,
    has_timing_cache=True,
    has_runtime_cache=False,
    supports_plugins=True,
    runtime_targets=None,
)

TENSORRT_RTX = TensorRTLibrary(
    flavour="tensorrt-rtx",
    module="tensorrt_rtx_bindings",
    title="TensorRT for RTX",
    min_version=(1, 7),
    pip_hint=f"{install_hint('tensorrt-rtx')}; docs/tensorrt.md",
    builds_without_gpu=True,
    always_strongly_typed=True,
    has_timing_cache=False,
    has_runtime_cache=True,
    supports_plugins=False,
    runtime_targets=frozenset(RTX_TARGETS),
)

LIBRARIES: dict[str, TensorRTLibrary] = {lib.flavour: lib for lib in (TENSORRT, TENSORRT_RTX)}


def library(flavour: str) -> TensorRTLibrary:
    """The library named `flavour` ("tensorrt" or "tensorrt-rtx")."""
    try:
        return LIBRARIES[flavour]
    except KeyError:
        raise LibraryError(
            f"unknown TensorRT flavour {flavour!r}; known: {', '.join(LIBRARIES)}"
        ) from None


def default_library() -> TensorRTLibrary:
    """Full TensorRT where it is installed, else TensorRT for RTX; LibraryError for neither."""
    for candidate in (TENSORRT, TENSORRT_RTX):
        if candidate.installed():
            return candidate
    raise LibraryError(
        "neither TensorRT nor TensorRT for RTX is installed here: "
        f"{TENSORRT_RTX.pip_hint}, or {TENSORRT.pip_hint}"
    )


__all__ = [
    "FLAVOURS",
    "LIBRARIES",
    "RTX_TARGETS",
    "TENSORRT",
    "TENSORRT_RTX",
    "Flavour",
    "LibraryError",
    "TensorRTLibrary",
    "default_library",
    "library",
    "parse_targets",
    "version_tuple",
]
