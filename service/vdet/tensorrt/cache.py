"""The TensorRT engine cache: one plan per model, GPU, precision and profile, each with a manifest.

This module owns where engines live on disk, what makes a plan reusable, and building one in the
background while the service keeps serving. A plan is only valid for the library it was built
with (flavour: full TensorRT or TensorRT for RTX, and its version), the GPUs it targets, the
plugin library and ONNX file it was built from, and the precision and batch profile it was built
with: `EngineKey` holds exactly those, and the JSON manifest beside each plan records the key it
was built for plus the plan's own sha256. A full-TensorRT plan targets the one GPU model it was
built on; a TensorRT-for-RTX plan is portable and targets a list of compute capabilities
(`gpu_name` "portable").

    <root>/<stem>.<gpu>-sm<cc>.<precision>.b<min>-<opt>-<max>.plan           (full TensorRT)
    <root>/<stem>.rtx-sm<cc>[-<cc>...].<precision>.b<min>-<opt>-<max>.plan   (TensorRT for RTX)
    ... and the same name with .json: the manifest

The file name carries what the caller asks for (model, library, GPU or targets, precision,
profile), so GPUs of different models can share one cache volume; what the caller cannot choose
(the library's version, plugin build, the ONNX file's content) is checked against the manifest.
A plan whose manifest is missing, unreadable or names another key, or whose bytes do not match
the manifest's sha256, is refused with a message that says which field differs, and
`get_or_build` rebuilds it in place. The manifest is written after the plan, so it is the
commit point of a build.

It must not import TensorRT: the build itself is a function handed in (engines/build.py makes
the TensorRT one), so everything here runs, and is tested, on a CPU.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from vdet.core.model import file_sha256

log = logging.getLogger(__name__)

# 2: the key has the library flavour, and compute_capability may list several targets.
MANIFEST_SCHEMA = 2
PORTABLE_GPU = "portable"
PLAN_SUFFIX = ".plan"
MANIFEST_SUFFIX = ".json"
# What an engine computes in: fp32 (TF32 allowed where TensorRT picks it), fp16, or whatever the
# ONNX itself declares ("onnx": Q/DQ INT8 from `vdet quantize`, or an FP16 conversion).
PRECISIONS = ("fp32", "fp16", "int8", "onnx")

T = TypeVar("T")


class EngineCacheError(RuntimeError):
    """The cache cannot produce an engine (the build failed or the cache is unusable)."""


class EngineMismatchError(EngineCacheError):
    """A plan exists but is not valid for this key; the message lists what differs."""


@dataclass(frozen=True)
class OptimizationProfile:
    """The batch sizes one TensorRT optimization profile covers: min <= opt <= max; and, for a
    model whose height and width are dynamic, the input (H, W) it covers from `min_hw` up to
    the model's own, tuned for `opt_hw` (rectangular letterboxes; None: the model's size only).
    The input sizes are part of the key but not of the label: a plan built for the model's size
    only is refused and rebuilt, in the same slot, by a request that wants rectangular inputs.
    """

    min: int = 1
    opt: int = 1
    max: int = 1
    min_hw: tuple[int, int] | None = None
    opt_hw: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        for name in ("min", "opt", "max"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"profile {name} batch must be a positive int, got {value!r}")
        if not self.min <= self.opt <= self.max:
            raise ValueError(
                f"profile batches must satisfy min <= opt <= max, got {self.min}, {self.opt}, "
                f"{self.max}"
            )
        if (self.min_hw is None) != (self.opt_hw is None):
            raise ValueError("profile min_hw and opt_hw are given together or not at all")
        if (
            self.min_hw is not None
            and self.opt_hw is not None
            and not all(0 < low <= opt for low, opt in zip(self.min_hw, self.opt_hw, strict=True))
        ):
            raise ValueError(
                f"profile input sizes must satisfy 0 < min_hw <= opt_hw, got {self.min_hw}, "
                f"{self.opt_hw}"
            )

    @classmethod
    def fixed(cls, batch: int) -> OptimizationProfile:
        return cls(batch, batch, batch)

    @property
    def label(self) -> str:
        return f"b{self.min}-{self.opt}-{self.max}"


def _hw(value: Any) -> tuple[int, int] | None:
    """An (H, W) read back from a manifest's JSON list (absent in plans of square profiles)."""
    if value is None:
        return None
    height, width = value
    return int(height), int(width)


@dataclass(frozen=True)
class EngineKey:
    """Everything a plan depends on. Two keys are equal exactly when one plan serves both.

    `plugin_sha256` is None for an engine without vdet's plugin node. `compute_capability` is
    "major.minor" (an A10 is "8.6"); for a portable TensorRT-for-RTX plan it lists every target,
    ascending and comma-separated ("8.6,8.9"), and `gpu_name` is "portable". `tensorrt_version`
    is the version of the library named by `flavour` ("10.8.0.43", "1.7.1.116").
    """

    gpu_name: str
    compute_capability: str
    tensorrt_version: str
    plugin_sha256: str | None
    onnx_sha256: str
    precision: str
    profile: OptimizationProfile
    flavour: str = "tensorrt"

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if not re.fullmatch(r"\d+\.\d+(,\d+\.\d+)*", self.compute_capability):
            raise ValueError(
                "compute capability must be 'major.minor' (a list: '8.6,8.9'), got "
                f"{self.compute_capability!r}"
            )
        if self.flavour not in ("tensorrt", "tensorrt-rtx"):
            raise ValueError(f"flavour must be tensorrt or tensorrt-rtx, got {self.flavour!r}")
        for name in ("gpu_name", "tensorrt_version", "onnx_sha256"):
            if not getattr(self, name):
                raise ValueError(f"{name} must not be empty")

    @property
    def targets(self) -> tuple[str, ...]:
        """The compute capabilities this plan runs on."""
        return tuple(self.compute_capability.split(","))

    def slot(self, stem: str) -> str:
        """The file name (without suffix) of this key's plan for a model called `stem`."""
        sm = "-".join(cc.replace(".", "") for cc in self.targets)
        if self.flavour == "tensorrt-rtx":
            gpu = "rtx" if self.gpu_name == PORTABLE_GPU else "rtx-" + _slug(self.gpu_name)
        else:
            gpu = _slug(self.gpu_name)
        model = re.sub(r"[^A-Za-z0-9_.-]+", "-", stem).strip(".-") or "model"
        return f"{model}.{gpu}-sm{sm}.{self.precision}.{self.profile.label}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EngineKey:
        profile = data["profile"]
        return cls(
            gpu_name=str(data["gpu_name"]),
            compute_capability=str(data["compute_capability"]),
            tensorrt_version=str(data["tensorrt_version"]),
            plugin_sha256=None if data["plugin_sha256"] is None else str(data["plugin_sha256"]),
            onnx_sha256=str(data["onnx_sha256"]),
            precision=str(data["precision"]),
            profile=OptimizationProfile(
                int(profile["min"]),
                int(profile["opt"]),
                int(profile["max"]),
                _hw(profile.get("min_hw")),
                _hw(profile.get("opt_hw")),
            ),
            flavour=str(data["flavour"]),
        )

    def differences(self, other: EngineKey) -> list[str]:
        """'field: plan X, wanted Y' for every field where `other` (the plan's) differs."""
        mine, theirs = self.to_dict(), other.to_dict()
        return [
            f"{name}: plan has {theirs[name]!r}, this machine wants {mine[name]!r}"
            for name in mine
            if mine[name] != theirs[name]
        ]


@dataclass(frozen=True)
class EngineManifest:
    """The JSON beside a plan: its key, its bytes' sha256, and how it was built.

    `model` carries the ONNX's class names and input size, so a plan with its manifest is enough
    to serve; `build` holds the builder's settings (informational, not part of the key).
    """

    key: EngineKey
    plan_sha256: str
    plan_bytes: int
    onnx_path: str
    model: dict[str, Any] = field(default_factory=dict)
    build: dict[str, Any] = field(default_factory=dict)
    created_utc: str = ""
    build_seconds: float = 0.0
    schema: int = MANIFEST_SCHEMA

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> EngineManifest:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("the manifest is not a JSON object")
        if data.get("schema") != MANIFEST_SCHEMA:
            raise ValueError(f"manifest schema {data.get('schema')!r}, expected {MANIFEST_SCHEMA}")
        return cls(
            key=EngineKey.from_dict(data["key"]),
            plan_sha256=str(data["plan_sha256"]),
            plan_bytes=int(data["plan_bytes"]),
            onnx_path=str(data["onnx_path"]),
            model=dict(data.get("model", {})),
            build=dict(data.get("build", {})),
            created_utc=str(data.get("created_utc", "")),
            build_seconds=float(data.get("build_seconds", 0.0)),
        )


def manifest_path(plan: str | os.PathLike[str]) -> Path:
    """The manifest that belongs to a plan file."""
    return Path(plan).with_suffix(MANIFEST_SUFFIX)


def read_manifest(plan: str | os.PathLike[str]) -> EngineManifest:
    """The manifest beside `plan`; EngineMismatchError when it is missing or unreadable."""
    path = manifest_path(plan)
    try:
        return EngineManifest.from_json(path.read_text())
    except FileNotFoundError:
        raise EngineMismatchError(
            f"{plan}: no manifest {path.name} beside it, so nothing says which GPU, TensorRT "
            "version and model it was built for"
        ) from None
    except (ValueError, KeyError, TypeError) as exc:
        raise EngineMismatchError(f"{plan}: unreadable manifest {path.name} ({exc})") from None


def verify_plan(plan: str | os.PathLike[str], key: EngineKey | None = None) -> EngineManifest:
    """Check a plan against its manifest (and `key`, when given); return the manifest.

    Raises FileNotFoundError when the plan does not exist and EngineMismatchError when it exists
    but must not be used, with every reason in the message.
    """
    plan = Path(plan)
    if not plan.is_file():
        raise FileNotFoundError(f"no engine at {plan}")
    manifest = read_manifest(plan)
    reasons = key.differences(manifest.key) if key is not None else []
    size = plan.stat().st_size
    if size != manifest.plan_bytes:
        reasons.append(f"plan is {size} bytes, the manifest says {manifest.plan_bytes}")
    elif file_sha256(plan) != manifest.plan_sha256:
        reasons.append("plan sha256 differs from the manifest's (corrupted or replaced)")
    if reasons:
        raise EngineMismatchError(f"{plan} does not match: " + "; ".join(reasons))
    return manifest


@dataclass(frozen=True)
class CachedEngine:
    """A verified plan: its path, its manifest, and whether this call built it."""

    plan: Path
    manifest: EngineManifest
    built: bool


# The build function: write a plan to the given path; return the builder settings to record.
PlanBuilder = Callable[[Path], Mapping[str, Any]]


class EngineCache:
    """Plans under one directory, keyed by `EngineKey`; safe across threads and processes.

    `get_or_build` holds an exclusive file lock per slot while it checks and builds, so two
    processes sharing a cache volume build an engine once, and the second reuses it.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def plan_path(self, key: EngineKey, stem: str) -> Path:
        return self.root / (key.slot(stem) + PLAN_SUFFIX)

    def lookup(self, key: EngineKey, stem: str) -> CachedEngine | None:
        """The valid plan for `key`, or None when there is none; a mismatch raises."""
        plan = self.plan_path(key, stem)
        try:
            return CachedEngine(plan, verify_plan(plan, key), built=False)
        except FileNotFoundError:
            return None

    def get_or_build(
        self,
        key: EngineKey,
        stem: str,
        build: PlanBuilder,
        *,
        onnx_path: str | os.PathLike[str] = "",
        model: Mapping[str, Any] | None = None,
    ) -> CachedEngine:
        """Reuse the plan for `key`, or build it with `build` and record its manifest.

        A plan that exists but does not match is logged with the reasons and rebuilt. A build
        that raises leaves any previous plan and manifest as they were.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        plan = self.plan_path(key, stem)
        with self._slot_lock(plan):
            try:
                return CachedEngine(plan, verify_plan(plan, key), built=False)
            except FileNotFoundError:
                log.info("no engine at %s; building it", plan)
            except EngineMismatchError as exc:
                log.warning("refusing the cached engine: %s; rebuilding it", exc)
            manifest = self._build(plan, key, build, str(onnx_path), dict(model or {}))
            return CachedEngine(plan, manifest, built=True)

    def _build(
        self,
        plan: Path,
        key: EngineKey,
        build: PlanBuilder,
        onnx_path: str,
        model: dict[str, Any],
    ) -> EngineManifest:
        tmp = plan.with_name(f"{plan.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        start = time.monotonic()
        try:
            details = dict(build(tmp))
            if not tmp.is_file() or tmp.stat().st_size == 0:
                raise EngineCacheError(f"the engine build wrote no plan to {tmp}")
            manifest = EngineManifest(
                key=key,
                plan_sha256=file_sha256(tmp),
                plan_bytes=tmp.stat().st_size,
                onnx_path=onnx_path,
                model=model,
                build=details,
                created_utc=datetime.now(UTC).isoformat(timespec="seconds"),
                build_seconds=round(time.monotonic() - start, 3),
            )
            # The old manifest goes first: a crash between the two renames leaves a plan
            # without a manifest (refused and rebuilt), never a manifest vouching for other bytes.
            manifest_path(plan).unlink(missing_ok=True)
            tmp.replace(plan)
            _write_atomic(manifest_path(plan), manifest.to_json())
        finally:
            tmp.unlink(missing_ok=True)
        log.info("built %s in %.1f s", plan, manifest.build_seconds)
        return manifest

    @contextlib.contextmanager
    def _slot_lock(self, plan: Path) -> Iterator[None]:
        lock_path = plan.with_name(plan.name + ".lock")
        with open(lock_path, "a+") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


BuildState = Literal["idle", "building", "ready", "failed"]


class BackgroundEngineBuilder(Generic[T]):
    """Runs one build on a daemon thread and hands the result to `on_ready` on that thread.

    While serving, the caller keeps its current backend; `on_ready` (e.g. a
    `SwappableBackend.swap`) switches streams over once the new engine exists. A build or an
    `on_ready` that raises ends in state "failed", with the exception passed to `on_error`
    after it is logged, and kept in `error`; nothing is swapped. `start` runs the build once;
    later calls return False.
    """

    def __init__(
        self,
        build: Callable[[], T],
        on_ready: Callable[[T], None],
        on_error: Callable[[BaseException], None] | None = None,
        name: str = "vdet-engine-build",
    ) -> None:
        self._build = build
        self._on_ready = on_ready
        self._on_error = on_error
        self._name = name
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._state: BuildState = "idle"
        self.result: T | None = None
        self.error: BaseException | None = None

    @property
    def state(self) -> BuildState:
        return self._state

    def start(self) -> bool:
        """Start the build; False when it was already started."""
        with self._lock:
            if self._thread is not None:
                return False
            self._state = "building"
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()
            return True

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the build and its callback have finished; False on timeout."""
        return self._done.wait(timeout)

    def _run(self) -> None:
        try:
            result = self._build()
            self.result = result
            self._on_ready(result)
        except BaseException as exc:  # reported, never raised on a thread nobody joins
            self.error = exc
            self._state = "failed"
            log.error("background engine build failed: %s", exc, exc_info=exc)
            if self._on_error is not None:
                try:
                    self._on_error(exc)
                except Exception:
                    log.exception("the on_error callback of the engine build failed")
        else:
            self._state = "ready"
        finally:
            self._done.set()
