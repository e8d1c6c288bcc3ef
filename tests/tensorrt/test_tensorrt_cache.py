"""vdet.tensorrt.cache on the CPU: engine keys, manifests, refusal and rebuild, background hand-off.

No TensorRT here. Where a test needs "a build", it uses `write_stand_in_plan`: a real function
that writes bytes to the plan path the cache hands it, so the cache's own logic (locking, temp
files, manifests, sha256 checks) runs for real. It is not TensorRT and nothing here claims to
test TensorRT; tests/tensorrt/ does that where TensorRT exists.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from support.engine_stand_ins import StandInBuilds, make_key

from vdet.config.base import ConfigError
from vdet.config.engine import EngineSettings
from vdet.config.settings import load_settings
from vdet.core.assets import asset_path
from vdet.core.model import file_sha256
from vdet.core.types import FloatArray
from vdet.inference.backends.base import InferenceBackend
from vdet.inference.backends.handoff import SwappableBackend, serve_while_building
from vdet.inference.backends.onnxruntime import OnnxRuntimeBackend
from vdet.tensorrt.build import BuildOptions
from vdet.tensorrt.cache import (
    MANIFEST_SCHEMA,
    BackgroundEngineBuilder,
    EngineCache,
    EngineKey,
    EngineManifest,
    EngineMismatchError,
    OptimizationProfile,
    manifest_path,
    read_manifest,
    verify_plan,
)
from vdet.tensorrt.surgery import DecodeNmsAttributes

DEMO = asset_path("demo.onnx")


# ---- keys and profiles ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((0, 1, 1), "positive"),
        ((2, 1, 4), "min <= opt <= max"),
        ((1, 8, 4), "min <= opt <= max"),
        ((1, True, 4), "positive int"),
    ],
)
def test_profile_validation(args: tuple[int, int, int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        OptimizationProfile(*args)


def test_profile_label_and_fixed() -> None:
    assert OptimizationProfile(1, 4, 8).label == "b1-4-8"
    assert OptimizationProfile.fixed(2) == OptimizationProfile(2, 2, 2)
    # Input sizes are keyed but not labelled: a square-only plan is refused in the same slot.
    rect = OptimizationProfile(1, 4, 8, (320, 320), (384, 640))
    assert rect.label == "b1-4-8" and rect != OptimizationProfile(1, 4, 8)


@pytest.mark.parametrize(
    ("min_hw", "opt_hw", "match"),
    [
        ((320, 320), None, "together"),
        (None, (384, 640), "together"),
        ((480, 320), (384, 640), "min_hw <= opt_hw"),
        ((0, 320), (384, 640), "min_hw <= opt_hw"),
    ],
)
def test_profile_input_sizes_validation(
    min_hw: tuple[int, int] | None, opt_hw: tuple[int, int] | None, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        OptimizationProfile(1, 1, 8, min_hw, opt_hw)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"precision": "int4"}, "precision"),
        ({"compute_capability": "86"}, "major.minor"),
        ({"gpu_name": ""}, "gpu_name"),
        ({"onnx_sha256": ""}, "onnx_sha256"),
    ],
)
def test_key_validation(changes: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make_key(**changes)


def test_slot_names_what_the_caller_chooses() -> None:
    key = make_key()
    assert key.slot("demo") == "demo.nvidia-a10-sm86.fp16.b1-4-8"
    # GPU models of one cache volume get their own slots; TensorRT version does not.
    assert make_key(gpu_name="NVIDIA H100 80GB HBM3").slot("demo") != key.slot("demo")
    assert make_key(tensorrt_version="11.1.0").slot("demo") == key.slot("demo")
    assert make_key().slot("my model/v2") == "my-model-v2.nvidia-a10-sm86.fp16.b1-4-8"


def test_key_round_trip_and_differences() -> None:
    key = make_key(plugin_sha256="cd" * 32)
    assert EngineKey.from_dict(json.loads(json.dumps(key.to_dict()))) == key
    rect = dataclasses.replace(key, profile=OptimizationProfile(1, 4, 8, (320, 320), (384, 640)))
    assert EngineKey.from_dict(json.loads(json.dumps(rect.to_dict()))) == rect
    assert rect.differences(key)[0].startswith("profile: plan has")
    other = make_key(tensorrt_version="11.1.0", plugin_sha256="ef" * 32)
    diffs = key.differences(other)
    assert len(diffs) == 2
    assert diffs[0] == ("tensorrt_version: plan has '11.1.0', this machine wants '10.8.0.43'")
    assert diffs[1].startswith("plugin_sha256: plan has 'efef")
    assert key.differences(make_key(plugin_sha256="cd" * 32)) == []


# ---- the cache --------------------------------------------------------------------------------


def test_get_or_build_builds_once_then_reuses(tmp_path: Path) -> None:
    cache, builds, key = EngineCache(tmp_path), StandInBuilds(), make_key()
    first = cache.get_or_build(key, "demo", builds.write_stand_in_plan, onnx_path="demo.onnx")
    assert first.built and builds.calls == 1
    assert first.plan == tmp_path / "demo.nvidia-a10-sm86.fp16.b1-4-8.plan"
    assert first.plan.read_bytes() == builds.payload
    manifest = json.loads(manifest_path(first.plan).read_text())
    assert manifest["schema"] == MANIFEST_SCHEMA
    assert manifest["key"] == key.to_dict()
    assert manifest["plan_sha256"] == file_sha256(first.plan)
    assert manifest["plan_bytes"] == len(builds.payload)
    assert manifest["build"]["builder"].startswith("stand-in")
    assert manifest["onnx_path"] == "demo.onnx"

    second = cache.get_or_build(key, "demo", builds.write_stand_in_plan)
    assert not second.built and builds.calls == 1
    assert second.manifest == first.manifest
    assert cache.lookup(key, "demo") == second
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"tensorrt_version": "10.9.0.34"}, "tensorrt_version: plan has '10.8.0.43'"),
        ({"plugin_sha256": "12" * 32}, "plugin_sha256: plan has None"),
        ({"onnx_sha256": "34" * 32}, "onnx_sha256: plan has 'abab"),
    ],
)
def test_mismatching_plan_is_refused_then_rebuilt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, changes: dict[str, object], reason: str
) -> None:
    cache, old = EngineCache(tmp_path), StandInBuilds(b"old plan")
    built = cache.get_or_build(make_key(), "demo", old.write_stand_in_plan)
    new_key = make_key(**changes)
    assert cache.plan_path(new_key, "demo") == built.plan  # same slot: replaced in place

    with pytest.raises(EngineMismatchError, match="does not match") as refused:
        cache.lookup(new_key, "demo")
    assert reason in str(refused.value)

    new = StandInBuilds(b"new plan")
    with caplog.at_level(logging.WARNING, logger="vdet.tensorrt.cache"):
        rebuilt = cache.get_or_build(new_key, "demo", new.write_stand_in_plan)
    assert rebuilt.built and new.calls == 1
    assert "refusing the cached engine" in caplog.text and reason in caplog.text
    assert rebuilt.plan.read_bytes() == b"new plan"
    assert read_manifest(rebuilt.plan).key == new_key
    assert cache.lookup(new_key, "demo") is not None


def test_corrupted_or_orphaned_plans_are_refused(tmp_path: Path) -> None:
    cache, builds, key = EngineCache(tmp_path), StandInBuilds(), make_key()
    plan = cache.get_or_build(key, "demo", builds.write_stand_in_plan).plan

    plan.write_bytes(builds.payload[:-1] + b"X")  # same size, other bytes
    with pytest.raises(EngineMismatchError, match="sha256 differs"):
        verify_plan(plan, key)
    plan.write_bytes(builds.payload + b"more")
    with pytest.raises(EngineMismatchError, match="bytes, the manifest says"):
        verify_plan(plan, key)
    assert cache.get_or_build(key, "demo", builds.write_stand_in_plan).built

    manifest_path(plan).unlink()  # a plan copied in without its manifest
    with pytest.raises(EngineMismatchError, match="no manifest"):
        cache.lookup(key, "demo")
    manifest_path(plan).write_text("{not json")
    with pytest.raises(EngineMismatchError, match="unreadable manifest"):
        cache.lookup(key, "demo")
    manifest_path(plan).write_text(json.dumps({"schema": 99}))
    with pytest.raises(EngineMismatchError, match="schema"):
        cache.lookup(key, "demo")
    assert cache.get_or_build(key, "demo", builds.write_stand_in_plan).built
    assert builds.calls == 3

    with pytest.raises(FileNotFoundError):
        verify_plan(tmp_path / "nothing.plan")
    assert cache.lookup(make_key(precision="fp32"), "demo") is None


def test_failed_build_keeps_the_previous_plan(tmp_path: Path) -> None:
    cache, builds = EngineCache(tmp_path), StandInBuilds(b"good plan")
    good = cache.get_or_build(make_key(), "demo", builds.write_stand_in_plan)

    def failing_build(plan: Path) -> dict[str, object]:
        plan.write_bytes(b"half a plan")
        raise RuntimeError("builder ran out of memory")

    def writes_nothing(plan: Path) -> dict[str, object]:
        return {}

    newer = make_key(tensorrt_version="10.9.0.34")
    with pytest.raises(RuntimeError, match="out of memory"):
        cache.get_or_build(newer, "demo", failing_build)
    with pytest.raises(RuntimeError, match="wrote no plan"):
        cache.get_or_build(newer, "demo", writes_nothing)
    assert good.plan.read_bytes() == b"good plan"
    assert verify_plan(good.plan, make_key()) == good.manifest
    assert not list(tmp_path.glob("*.tmp"))


def test_concurrent_requests_build_once(tmp_path: Path) -> None:
    builds, key = StandInBuilds(), make_key()
    results = []

    def request() -> None:
        # Each thread has its own EngineCache, like separate processes on one volume.
        results.append(EngineCache(tmp_path).get_or_build(key, "demo", builds.write_stand_in_plan))

    threads = [threading.Thread(target=request) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert builds.calls == 1
    assert sum(r.built for r in results) == 1 and len(results) == 6


def test_manifest_json_round_trip() -> None:
    manifest = EngineManifest(
        key=make_key(),
        plan_sha256="00" * 32,
        plan_bytes=3,
        onnx_path="m.onnx",
        model={"names": ["a"], "input_hw": [640, 640]},
        build={"strongly_typed": True},
        created_utc="2026-12-02T00:00:00+00:00",
        build_seconds=1.5,
    )
    assert EngineManifest.from_json(manifest.to_json()) == manifest


# ---- background build and hand-off ------------------------------------------------------------


def test_background_builder_states_and_callbacks() -> None:
    ready: list[str] = []
    builder = BackgroundEngineBuilder(lambda: "engine", ready.append)
    assert builder.state == "idle"
    assert builder.start() and not builder.start()
    assert builder.wait(5)
    assert builder.state == "ready" and builder.result == "engine" and ready == ["engine"]

    errors: list[BaseException] = []

    def fails() -> str:
        raise RuntimeError("no GPU memory")

    failed = BackgroundEngineBuilder(fails, ready.append, on_error=errors.append)
    failed.start()
    assert failed.wait(5)
    assert failed.state == "failed" and isinstance(failed.error, RuntimeError)
    assert errors == [failed.error] and ready == ["engine"]

    def rejects(value: str) -> None:
        raise ValueError("signature differs")

    refused = BackgroundEngineBuilder(lambda: "engine", rejects, on_error=errors.append)
    refused.start()
    assert refused.wait(5) and refused.state == "failed"
    assert isinstance(errors[-1], ValueError)


class GatedBackend(InferenceBackend):
    """ONNX Runtime whose calls wait at a gate: holds a call 'in flight' during a swap."""

    def __init__(self, inner: OnnxRuntimeBackend) -> None:
        self.inner = inner
        self.name = inner.name
        self.info = inner.info
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.closed = False

    @property
    def device(self) -> str:
        return "gated " + self.inner.device

    @property
    def max_batch(self) -> int | None:
        return self.inner.max_batch

    def infer(self, batch: FloatArray) -> FloatArray:
        self.entered.set()
        assert self.gate.wait(10)
        return self.inner.infer(batch)

    def close(self) -> None:
        self.closed = True
        self.inner.close()


@pytest.fixture
def demo() -> Path:
    if not DEMO.is_file():
        pytest.skip("service/vdet/assets/demo.onnx is not present")
    return DEMO


def _batch() -> FloatArray:
    return np.random.default_rng(0).random((1, 3, 640, 640), dtype=np.float32)


def test_swap_waits_for_calls_in_flight(demo: Path) -> None:
    old = GatedBackend(OnnxRuntimeBackend(demo, threads=1))
    swappable = SwappableBackend(old)
    result: list[FloatArray] = []
    caller = threading.Thread(target=lambda: result.append(swappable.infer(_batch())))
    caller.start()
    assert old.entered.wait(10)

    new = OnnxRuntimeBackend(demo, threads=1)
    assert swappable.swap(new) is old
    assert swappable.current is new and not old.closed  # still running a call
    old.gate.set()
    caller.join(10)
    assert old.closed and result[0].shape == (1, 10, 8400)
    swappable.close()
    with pytest.raises(RuntimeError, match="closed"):
        swappable.infer(_batch())


def test_swap_refuses_another_model(demo: Path) -> None:
    swappable = SwappableBackend(OnnxRuntimeBackend(demo, threads=1))
    other = GatedBackend(OnnxRuntimeBackend(demo, threads=1))
    other.info = dataclasses.replace(other.info, input_hw=(320, 320))
    with pytest.raises(ValueError, match="signatures differ"):
        swappable.swap(other)
    assert not other.closed
    swappable.close()


def _stand_in_engine_build(
    cache_dir: Path, demo: Path, gate: threading.Event, built: list[Path]
) -> Callable[[], InferenceBackend]:
    """A background 'engine build' that is not TensorRT: it writes a stand-in plan through the
    real EngineCache, waits for the test, and returns another ONNX Runtime backend."""

    def build() -> InferenceBackend:
        cached = EngineCache(cache_dir).get_or_build(
            make_key(), "demo", StandInBuilds().write_stand_in_plan, onnx_path=demo
        )
        built.append(cached.plan)
        assert gate.wait(30)
        return OnnxRuntimeBackend(demo, threads=1)

    return build


def test_streams_keep_their_backend_until_the_engine_is_ready(demo: Path, tmp_path: Path) -> None:
    fallback = OnnxRuntimeBackend(demo, threads=1)
    gate, built = threading.Event(), []
    swappable, builder = serve_while_building(
        fallback, _stand_in_engine_build(tmp_path, demo, gate, built)
    )
    batch = _batch()
    expected = fallback.infer(batch)
    seen: list[InferenceBackend] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def stream() -> None:  # a source's worker thread, calling infer frame after frame
        try:
            while not stop.is_set():
                backend = swappable.current
                np.testing.assert_array_equal(swappable.infer(batch), expected)
                seen.append(backend)
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=stream)
    worker.start()
    deadline = time.monotonic() + 60
    # The plan exists and the stream has run frames, but the backend is not ready yet.
    while (not built or len(seen) < 2) and time.monotonic() < deadline and not errors:
        time.sleep(0.01)
    assert built and built[0].is_file() and not errors
    assert builder.state == "building"
    assert swappable.current is fallback and all(b is fallback for b in seen)
    frames_before = len(seen)
    assert frames_before >= 2

    gate.set()
    assert builder.wait(30) and builder.state == "ready"
    new = swappable.current
    assert new is not fallback and new is builder.result
    while len(seen) < frames_before + 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    worker.join(30)
    assert not errors
    assert seen[-1] is new
    switch = seen.index(new)
    assert all(b is fallback for b in seen[:switch]) and all(b is new for b in seen[switch:])
    assert fallback._pool is None  # closed once its last call returned
    swappable.close()


def test_a_failed_build_keeps_serving(demo: Path, caplog: pytest.LogCaptureFixture) -> None:
    fallback = OnnxRuntimeBackend(demo, threads=1)

    def build() -> InferenceBackend:
        raise RuntimeError("TensorRT could not parse the model")

    with caplog.at_level(logging.WARNING):
        swappable, builder = serve_while_building(fallback, build)
        assert builder.wait(10)
    assert builder.state == "failed" and swappable.current is fallback
    assert "still serving on cpu" in caplog.text
    assert swappable.infer(_batch()).shape == (1, 10, 8400)
    swappable.close()


def test_an_engine_finished_after_close_is_closed(demo: Path, tmp_path: Path) -> None:
    gate, built = threading.Event(), []
    swappable, builder = serve_while_building(
        OnnxRuntimeBackend(demo, threads=1), _stand_in_engine_build(tmp_path, demo, gate, built)
    )
    swappable.close()
    gate.set()
    assert builder.wait(30) and builder.state == "failed"
    assert isinstance(builder.result, OnnxRuntimeBackend)
    assert builder.result._pool is None  # not leaked


# ---- configuration ------------------------------------------------------------------------------


def test_engine_settings_defaults_and_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    engine = load_settings().engine
    assert engine.cache_dir == tmp_path / "xdg" / "vdet" / "engines"
    assert (engine.precision, engine.plugin_nms, engine.build_in_background) == (
        "auto",
        False,
        True,
    )

    monkeypatch.setenv("VDET_ENGINE__CACHE_DIR", "/var/lib/vdet/engines")  # the GPU image's
    monkeypatch.setenv("VDET_ENGINE__PRECISION", "fp16")
    monkeypatch.setenv("VDET_ENGINE__MAX_BATCH", "16")
    engine = load_settings().engine
    assert engine.cache_dir == Path("/var/lib/vdet/engines")
    assert (engine.precision, engine.max_batch) == ("fp16", 16)


def test_engine_settings_from_yaml_and_validation(tmp_path: Path) -> None:
    config = tmp_path / "vdet.yaml"
    config.write_text(
        "engine: {precision: int8, min_batch: 2, opt_batch: 4, max_batch: 8, "
        "workspace_mib: 2048, optimization_level: 5, plugin_nms: true}\n"
        "detection: {conf_threshold: 0.3, iou_threshold: 0.5, max_det: 100}\n"
    )
    settings = load_settings(config)
    options = BuildOptions.from_settings(settings.engine, settings.detection)
    assert options.precision == "int8"
    assert options.profile == OptimizationProfile(2, 4, 8)
    assert (options.workspace_mib, options.optimization_level) == (2048, 5)
    assert options.plugin_nms == DecodeNmsAttributes(
        score_threshold=0.3, iou_threshold=0.5, top_k=1000, max_det=100
    )
    assert BuildOptions.from_settings(EngineSettings()).plugin_nms is None

    for bad, match in [
        ("engine: {min_batch: 4, max_batch: 2}", "min_batch <= opt_batch <= max_batch"),
        ("engine: {precision: int4}", "precision"),
        ("engine: {optimization_level: 6}", "optimization_level"),
        ("engine: {cache: /tmp}", "unknown key"),
    ]:
        config.write_text(bad + "\n")
        with pytest.raises(ConfigError, match=match):
            load_settings(config)
