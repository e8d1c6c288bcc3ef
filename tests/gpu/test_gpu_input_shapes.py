"""Rectangular inputs on the GPU path, on the CPU: which input shape a frame runs at, a stream's
runner built for its shape and rebuilt when its resolution needs another, batchers per shape
(a batch holds one shape; streams of mixed resolutions still batch), and the torch backend's
network at a rectangular input against ONNX Runtime.

The runners run eagerly (CPU torch has no CUDA graphs) on the toy network of
tests/support/toy_network.py, whose head does not depend on the input's size: what is under
test is which runner and shape each frame gets, and that its detections equal a runner built
for that shape. The same paths with CUDA graphs and the real kernels:
tests/gpu/test_gpu_input_shapes_gpu.py.
"""

from __future__ import annotations

import threading
from collections import Counter

import numpy as np
import pytest
import torch
from support.toy_network import toy_network

from vdet.config.gpu import GpuSettings
from vdet.core.assets import asset_path
from vdet.core.types import ColourMatrix, ColourRange
from vdet.gpu.devices import GpuDevice, GpuTuning
from vdet.gpu.graphs import CudaGraphRunner, Network, RunnerOptions, as_numpy_rows
from vdet.gpu.input_shapes import COMMON_SOURCE_WH, InputShapes
from vdet.inference.postprocess import PostprocessParams
from vdet.ingest.nvdec import GpuVideoFrame

DEMO = asset_path("demo.onnx")
MODEL_HW = (64, 64)
STRIDE = 16
PARAMS = PostprocessParams(conf_threshold=0.3, iou_threshold=0.5, max_det=10)


@pytest.mark.parametrize(
    ("source_wh", "model_hw", "stride", "rect", "min_hw", "expected"),
    [
        ((1920, 1080), (640, 640), 32, True, None, (384, 640)),
        ((1280, 720), (640, 640), 32, True, None, (384, 640)),
        ((640, 480), (640, 640), 32, True, None, (480, 640)),
        ((1080, 1920), (640, 640), 32, True, None, (640, 384)),  # portrait
        ((1000, 1000), (640, 640), 32, True, None, (640, 640)),
        ((1920, 1080), (640, 640), 32, False, None, (640, 640)),  # input_shape: square
        # An engine whose profile starts at 448 rows: 16:9 pads to 448, at the same scale.
        ((1920, 1080), (640, 640), 32, True, (448, 320), (448, 640)),
        ((640, 480), (640, 640), 32, True, (448, 320), (480, 640)),
        ((96, 48), (64, 64), 16, True, None, (32, 64)),
    ],
)
def test_a_frame_runs_at_the_input_its_size_and_the_setting_choose(
    source_wh: tuple[int, int],
    model_hw: tuple[int, int],
    stride: int,
    rect: bool,
    min_hw: tuple[int, int] | None,
    expected: tuple[int, int],
) -> None:
    assert InputShapes(model_hw, stride, rect, min_hw).of(source_wh) == expected


@pytest.mark.parametrize(
    ("model_hw", "stride", "min_hw"),
    [
        ((640, 630), 32, None),
        ((640, 640), 0, None),
        ((640, 640), 32, (0, 32)),
        ((64, 64), 16, (96, 64)),
    ],
)
def test_input_shapes_refuse_a_model_size_or_minimum_that_cannot_be(
    model_hw: tuple[int, int], stride: int, min_hw: tuple[int, int] | None
) -> None:
    with pytest.raises(ValueError, match=r"stride|min_hw"):
        InputShapes(model_hw, stride, True, min_hw)


def _frame(source: str, index: int, size_wh: tuple[int, int]) -> GpuVideoFrame:
    w, h = size_wh
    rng = np.random.default_rng(index)
    nv12 = rng.integers(0, 256, (h * 3 // 2, w), dtype=np.uint8)
    nv12[:h] = np.clip(nv12[:h].astype(int) // 2 + 31 * index, 0, 255)
    return GpuVideoFrame(
        source_id=source,
        index=index,
        pts_seconds=index / 30,
        arrival_time=0.0,
        decode_seconds=0.0,
        width=w,
        height=h,
        nv12=torch.from_numpy(nv12),
        matrix=ColourMatrix.BT709,
        colour_range=ColourRange.LIMITED,
        stream=None,
        ready=None,
    )


class _Factory:
    """The worker's network factory, recording which (batch, input) networks it was asked for."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, tuple[int, int]]] = []
        self._lock = threading.Lock()

    def __call__(self, batch: int, input_hw: tuple[int, int]) -> Network:
        with self._lock:
            self.calls.append((batch, input_hw))
        return toy_network


def _worker(factory: _Factory, rect: bool = True, **settings: object) -> GpuDevice:
    return GpuDevice(
        "cpu",
        factory,
        input_hw=MODEL_HW,
        dtype=torch.float32,
        settings=GpuSettings(**settings),  # type: ignore[arg-type]
        tuning=GpuTuning(ops="torch", cuda_graphs=False),
        index=0,
        channels_last=False,
        input_shapes=InputShapes(MODEL_HW, STRIDE, rect=rect),
    )


def _expected(frame: GpuVideoFrame, input_hw: tuple[int, int]) -> np.ndarray:
    runner = CudaGraphRunner(
        toy_network,
        input_hw=input_hw,
        options=RunnerOptions(
            dtype=torch.float32, device="cpu", channels_last=False, use_graphs=False
        ),
    )
    return as_numpy_rows(runner.run_frame(frame, PARAMS))


def test_a_runner_is_built_for_its_streams_shape_and_rebuilt_when_a_new_size_needs_another() -> (
    None
):
    factory = _Factory()
    worker = _worker(factory)
    try:
        sizes = [(96, 48), (128, 64), (64, 48), (96, 48)]  # 2:1, 2:1, 4:3, 2:1
        shapes = [(32, 64), (32, 64), (48, 64), (32, 64)]
        for index, (size, shape) in enumerate(zip(sizes, shapes, strict=True)):
            frame = _frame("cam", index, size)
            detections, _ = worker.detect("cam", frame, PARAMS)
            assert worker.runner_shape("cam") == shape
            rows = np.concatenate(
                (
                    detections.xyxy,
                    detections.scores[:, None],
                    detections.class_ids[:, None].astype(np.float32),
                ),
                axis=1,
            )
            np.testing.assert_allclose(rows, _expected(frame, shape), atol=1e-5)
        # 2:1 -> 4:3 -> 2:1 rebuilt twice; 96x48 -> 128x64 kept its runner (same shape).
        assert worker.runner_rebuilds == 2
        assert factory.calls == [(1, (32, 64)), (1, (48, 64)), (1, (32, 64))]
        # Another stream at 4:3 has a runner of its own at its shape.
        worker.detect("other", _frame("other", 0, (64, 48)), PARAMS)
        assert worker.runner_shape("other") == (48, 64)
        assert worker.runner_shape("cam") == (32, 64)
        worker.release("other")
        assert worker.runner_shape("other") is None
        assert "rect inputs" in worker.describe()
    finally:
        worker.close()


def test_input_shape_square_runs_every_frame_at_the_model_size() -> None:
    factory = _Factory()
    worker = _worker(factory, rect=False)
    try:
        for index, size in enumerate([(96, 48), (64, 48)]):
            worker.detect("cam", _frame("cam", index, size), PARAMS)
            assert worker.runner_shape("cam") == MODEL_HW
        assert worker.runner_rebuilds == 0 and factory.calls == [(1, MODEL_HW)]
        assert "square inputs" in worker.describe()
    finally:
        worker.close()


def test_batched_streams_of_mixed_resolutions_batch_per_shape() -> None:
    """Six streams, three at 2:1 and three at 4:3, from their own threads: one batcher per
    shape, made on demand, each batch of one shape, and each frame's detections those of a
    runner at its shape."""
    factory = _Factory()
    worker = _worker(factory, batch=3, batch_wait_ms=50)
    # With rect, the 16:9 camera's shape is ready up front; others come with their first frame.
    assert worker.batched_shapes == [worker.input_shapes.of(COMMON_SOURCE_WH)]
    sizes = {f"wide{i}": (96, 48) for i in range(3)} | {f"tv{i}": (64, 48) for i in range(3)}
    per_source = 4
    got: dict[tuple[str, int], np.ndarray] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(len(sizes))

    def stream(source: str) -> None:
        start.wait()
        try:
            for index in range(per_source):
                detections, _ = worker.detect(source, _frame(source, index, sizes[source]), PARAMS)
                got[source, index] = np.concatenate(
                    (
                        detections.xyxy,
                        detections.scores[:, None],
                        detections.class_ids[:, None].astype(np.float32),
                    ),
                    axis=1,
                )
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=stream, args=(s,)) for s in sizes]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert errors == []
        assert sorted(worker.batched_shapes) == [(32, 64), (48, 64)]
        batchers = worker._batchers
        for shape in ((32, 64), (48, 64)):
            batcher = batchers[shape]
            assert batcher.runner.input_hw == shape
            assert batcher.frames == 3 * per_source
            assert batcher.batches < batcher.frames  # streams of one shape shared batches
        # Networks per shape: the batch-3 one and its buckets (1, 2), once per shape.
        assert Counter(factory.calls) == Counter(
            (size, shape) for shape in ((32, 64), (48, 64)) for size in (3, 1, 2)
        )
        for (source, index), rows in got.items():
            frame = _frame(source, index, sizes[source])
            shape = (32, 64) if source.startswith("wide") else (48, 64)
            np.testing.assert_allclose(rows, _expected(frame, shape), atol=1e-5)
    finally:
        worker.close()
    with pytest.raises(RuntimeError, match="closed"):
        worker.detect("wide0", _frame("wide0", 9, (96, 48)), PARAMS)


def test_batched_square_worker_builds_its_one_batcher_up_front() -> None:
    factory = _Factory()
    worker = _worker(factory, rect=False, batch=2)
    try:
        assert worker.batched_shapes == [MODEL_HW]
        assert sorted(factory.calls) == [(1, MODEL_HW), (2, MODEL_HW)]
    finally:
        worker.close()


def test_torch_backend_network_at_a_rect_input_matches_onnxruntime() -> None:
    """The demo's height and width are dynamic: the converted network at 384x640 has that
    shape's 5040 anchors (the grid is folded per shape, not kept at 640x640) and the raw head
    ONNX Runtime gives at that input (FP32, tolerances of the square test in
    tests/inference/test_inference_torch_backend.py). 480x640 runs on the GPU
    (tests/gpu/test_gpu_input_shapes_gpu.py)."""
    input_hw = (384, 640)
    pytest.importorskip("onnx2torch")
    from vdet.inference.backends.onnxruntime import OnnxRuntimeBackend
    from vdet.inference.backends.torch import TorchBackend

    H, W = input_hw
    images = np.random.default_rng(1).random((1, 3, H, W), dtype=np.float32)
    with TorchBackend(DEMO, device="cpu", cuda_graph=False) as backend:
        assert backend.rect_networks
        network = backend.network_for(1, input_hw)
        assert backend.network_for(1, input_hw) is network  # cached per (batch, shape)
        with torch.no_grad():
            raw = network(torch.from_numpy(images)).float().numpy()
        with pytest.raises(ValueError, match="not \\(400, 640\\)"):
            backend.network_for(1, (400, 640))
        with pytest.raises(ValueError, match="not \\(704, 640\\)"):
            backend.network_for(1, (704, 640))
    with OnnxRuntimeBackend(DEMO, threads=2) as reference:
        expected = reference.infer(images)
    anchors = (H // 8) * (W // 8) + (H // 16) * (W // 16) + (H // 32) * (W // 32)
    assert raw.shape == expected.shape == (1, 10, anchors)
    np.testing.assert_allclose(raw[:, :4], expected[:, :4], atol=2e-3, rtol=0)
    np.testing.assert_allclose(raw[:, 4:], expected[:, 4:], atol=1e-5, rtol=0)
