"""The backend registry and the ONNX Runtime backend, on tiny hand-built graphs."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto

from vdet.core.model import ModelError, ModelInfo
from vdet.inference import backends
from vdet.inference.backends import BackendSpec, create_backend, known_backends, register_backend
from vdet.inference.backends.base import InferenceBackend
from vdet.inference.backends.onnxruntime import OnnxRuntimeBackend

HeadModelWriter = Callable[..., Path]  # the conftest fixture
YoloExporter = Callable[[int | tuple[int, int], bool], tuple[object, Path]]  # conftest


def mean_model(write: HeadModelWriter, batch: int | str, **kwargs: Any) -> Path:
    """A model whose output is head + the image's mean, so rows can be traced to images."""
    head = np.arange(6 * 4, dtype=np.float32).reshape(6, 4)
    output_shape = [batch, 6, 4]
    return write(
        nc=2,
        num_anchors=4,
        batch=batch,
        head=head,
        input_gain=1.0,
        output_shape=output_shape,
        **kwargs,
    )


def expected_rows(batch: np.ndarray) -> np.ndarray:
    head = np.arange(6 * 4, dtype=np.float32).reshape(1, 6, 4)
    means: np.ndarray = batch.mean(axis=(1, 2, 3), dtype=np.float32)
    rows: np.ndarray = head + means[:, None, None]
    return rows


def images(n: int) -> np.ndarray:
    # A distinct constant per image: the mean identifies the image exactly.
    return np.broadcast_to(
        (np.arange(n, dtype=np.float32) / 8)[:, None, None, None], (n, 3, 32, 32)
    ).copy()


@pytest.mark.parametrize("fixed_batch", [1, 2, 4])
@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_static_batch_models_split_and_pad(
    write_head_model: HeadModelWriter, fixed_batch: int, n: int
) -> None:
    with OnnxRuntimeBackend(mean_model(write_head_model, fixed_batch), threads=1) as backend:
        assert backend.max_batch == fixed_batch
        batch = images(n)
        raw = backend.infer(batch)
    assert raw.shape == (n, 6, 4)
    assert raw.dtype == np.float32
    np.testing.assert_allclose(raw, expected_rows(batch), rtol=1e-6)


@pytest.mark.parametrize("n", [1, 7])
def test_dynamic_batch_model(write_head_model: HeadModelWriter, n: int) -> None:
    with OnnxRuntimeBackend(mean_model(write_head_model, "batch")) as backend:
        assert backend.max_batch is None
        assert backend.info.batch is None
        batch = images(n)
        np.testing.assert_allclose(backend.infer(batch), expected_rows(batch), rtol=1e-6)


def test_float16_model_takes_float32_batches(write_head_model: HeadModelWriter) -> None:
    path = mean_model(write_head_model, 1, input_type=TensorProto.FLOAT16)
    with OnnxRuntimeBackend(path) as backend:
        batch = images(2)
        np.testing.assert_allclose(backend.infer(batch), expected_rows(batch), rtol=1e-3)


def test_infer_is_thread_safe(write_head_model: HeadModelWriter) -> None:
    with OnnxRuntimeBackend(mean_model(write_head_model, 2), threads=1) as backend:
        batches = [images(n) for n in (1, 2, 3, 4, 5, 6, 7, 8)] * 4
        with ThreadPoolExecutor(max_workers=8) as pool:
            results = list(pool.map(backend.infer, batches))
    for batch, raw in zip(batches, results, strict=True):
        np.testing.assert_allclose(raw, expected_rows(batch), rtol=1e-6)


def test_sessions_serve_concurrent_calls(write_head_model: HeadModelWriter) -> None:
    with OnnxRuntimeBackend(mean_model(write_head_model, 2), sessions=2) as backend:
        assert backend.parallel_calls == 2
        # the cores shared out: one thread each on 2 cores, at least one anywhere
        assert "2 sessions x " in backend.device
        batches = [images(n) for n in (1, 2, 3, 4, 5)] * 4
        with ThreadPoolExecutor(max_workers=6) as pool:
            results = list(pool.map(backend.infer, batches))
    for batch, raw in zip(batches, results, strict=True):
        np.testing.assert_allclose(raw, expected_rows(batch), rtol=1e-6)


@pytest.mark.parametrize("sessions", [0, 65, True, 1.5])
def test_bad_session_counts(write_head_model: HeadModelWriter, sessions: Any) -> None:
    with pytest.raises(ValueError, match="sessions"):
        OnnxRuntimeBackend(mean_model(write_head_model, 1), sessions=sessions)


@pytest.mark.parametrize(
    ("batch", "match"),
    [
        (np.zeros((0, 3, 32, 32), np.float32), "empty"),
        (np.zeros((1, 3, 32, 16), np.float32), "shape"),
        (np.zeros((3, 32, 32), np.float32), "shape"),
        (np.zeros((1, 32, 32, 3), np.float32), "shape"),
        (np.zeros((1, 3, 32, 32), np.float64), "float32"),
    ],
)
def test_infer_rejects_bad_batches(
    write_head_model: HeadModelWriter, batch: np.ndarray, match: str
) -> None:
    with (
        OnnxRuntimeBackend(mean_model(write_head_model, 1)) as backend,
        pytest.raises(ValueError, match=match),
    ):
        backend.infer(batch)


def test_closed_backend_refuses_work(write_head_model: HeadModelWriter) -> None:
    backend = OnnxRuntimeBackend(mean_model(write_head_model, 1))
    backend.close()
    backend.close()  # harmless twice
    with pytest.raises(RuntimeError, match="closed"):
        backend.infer(images(1))


@pytest.mark.parametrize("threads", [0, -1, True])
def test_bad_thread_counts(write_head_model: HeadModelWriter, threads: Any) -> None:
    with pytest.raises(ValueError, match="threads"):
        OnnxRuntimeBackend(mean_model(write_head_model, 1), threads=threads)


def test_unsupported_model_fails_at_construction(write_head_model: HeadModelWriter) -> None:
    with pytest.raises(ModelError, match="exactly one output"):
        OnnxRuntimeBackend(write_head_model(extra_output=True))


def test_backend_describes_itself(write_head_model: HeadModelWriter) -> None:
    with OnnxRuntimeBackend(mean_model(write_head_model, 1), threads=2) as backend:
        assert backend.name == "onnxruntime"
        assert backend.device.startswith("cpu (onnxruntime ")
        assert "2 threads" in backend.device and "sessions" not in backend.device
        assert backend.parallel_calls == 1
        assert "OnnxRuntimeBackend" in repr(backend)


def test_known_backends() -> None:
    kinds = known_backends()
    assert kinds[0] == "auto"
    assert "onnxruntime" in kinds


@pytest.mark.parametrize("kind", ["auto", "onnxruntime"])
def test_create_backend(write_head_model: HeadModelWriter, kind: str) -> None:
    with create_backend(kind, mean_model(write_head_model, 1), threads=1) as backend:
        assert isinstance(backend, OnnxRuntimeBackend)


@pytest.mark.parametrize("kind", ["", "tensorrt-typo", "AUTO", "cuda"])
def test_create_backend_unknown_kind(write_head_model: HeadModelWriter, kind: str) -> None:
    with pytest.raises(ValueError, match=r"unknown backend .*known: auto, .*onnxruntime"):
        create_backend(kind, mean_model(write_head_model, 1))


def test_auto_without_a_backend_for_the_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no registered backend can run"):
        create_backend("auto", tmp_path / "model.engine")


@pytest.mark.parametrize("kind", ["auto", ""])
def test_reserved_kinds_cannot_be_registered(kind: str) -> None:
    spec = BackendSpec(kind, OnnxRuntimeBackend, 1, lambda: True, lambda path: True)
    with pytest.raises(ValueError, match="cannot be a backend kind"):
        register_backend(spec)


class FakeBackend(InferenceBackend):
    name = "fake"

    def __init__(self, path: Path, **options: Any) -> None:
        self.info = ModelInfo(path, ("a",), (32, 32), 1, None, "")
        self.options = options

    @property
    def device(self) -> str:
        return "nowhere"

    @property
    def max_batch(self) -> int | None:
        return None

    def infer(self, batch: np.ndarray) -> np.ndarray:
        return np.zeros((len(self.check_batch(batch)), 5, 1), np.float32)

    def close(self) -> None:
        pass


@pytest.mark.parametrize(
    ("available", "priority", "chosen"),
    [(True, 300, FakeBackend), (False, 300, OnnxRuntimeBackend), (True, 50, OnnxRuntimeBackend)],
)
def test_auto_picks_the_best_available(
    monkeypatch: pytest.MonkeyPatch,
    write_head_model: HeadModelWriter,
    available: bool,
    priority: int,
    chosen: type,
) -> None:
    known_backends()  # discover first, so the monkeypatched entry is undone cleanly
    spec = BackendSpec("fake", FakeBackend, priority, lambda: available, lambda p: True)
    monkeypatch.setitem(backends._REGISTRY, "fake", spec)
    with create_backend("auto", mean_model(write_head_model, 1), threads=1) as backend:
        assert type(backend) is chosen
    fake = create_backend("fake", "x.bin", colour="blue")
    assert isinstance(fake, FakeBackend)
    assert fake.options == {"colour": "blue"}


def test_auto_passes_over_a_backend_that_fails_to_load_and_says_why(
    monkeypatch: pytest.MonkeyPatch, write_head_model: HeadModelWriter
) -> None:
    """An engine that cannot be built or loaded must not stop the service: `auto` serves the
    next backend and the reason travels with it (/readyz, vdet_backend)."""
    known_backends()

    def broken(path: Path, **options: Any) -> InferenceBackend:
        raise RuntimeError("engine build failed: node 'x' (Foo) unsupported")

    specs = {
        "broken": BackendSpec("broken", broken, 400, lambda: True, lambda p: True),
        "absent": BackendSpec(
            "absent", FakeBackend, 350, lambda: False, lambda p: True, lambda: "no GPU here"
        ),
    }
    for kind, spec in specs.items():
        monkeypatch.setitem(backends._REGISTRY, kind, spec)
    with create_backend("auto", mean_model(write_head_model, 1), threads=1) as backend:
        assert type(backend) is OnnxRuntimeBackend
        assert backend.selection.startswith("auto: onnxruntime")
        assert "broken: failed to load (engine build failed: node 'x'" in backend.selection
        assert "absent: no GPU here" in backend.selection
        assert not backend.gpu_data_path
    with create_backend("onnxruntime", mean_model(write_head_model, 1), threads=1) as backend:
        assert backend.selection == "configured: backend onnxruntime"


@pytest.mark.slow
@pytest.mark.train
def test_real_yolov8n_runs_on_onnxruntime(yolov8n_export: YoloExporter) -> None:
    _, path = yolov8n_export((256, 320), True)
    with OnnxRuntimeBackend(path, threads=2) as backend:
        raw = backend.infer(np.full((3, 3, 256, 320), 0.5, np.float32))
    # 256x320 at strides 8, 16, 32: 32*40 + 16*20 + 8*10 anchors
    assert raw.shape == (3, 84, 1680)
