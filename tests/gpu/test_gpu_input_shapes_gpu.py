"""Rectangular inputs through the CUDA-graph runners and the GPU device, against the CPU detector.

Needs a CUDA GPU and onnx2torch (skipped otherwise). The torch backend's network at 384x640
and 480x640 (the demo's height and width are dynamic), the vdet CUDA kernels where they run
(else the torch reference ops), frames made from the project's synthetic scenes as in
test_gpu_torch_backend.py, whose FP16 tolerances and twin matching these tests reuse: every
CPU detection scoring >= 0.5 has a twin (same class, score within 0.03, IoU >= 0.85 or every
corner within 4 px). The CPU reference is `Detector` on ONNX Runtime with `input_shape: rect`,
which letterboxes each frame into the same rectangular input.

The CPU side of the same logic (shape choice, runner per stream and shape, batchers per shape)
is tests/gpu/test_gpu_input_shapes.py; the kernels alone are test_gpu_kernels_rect.py.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
with warnings.catch_warnings():  # whatever its import warns about must not stop collection
    warnings.simplefilter("ignore")
    pytest.importorskip("onnx2torch")

from support.gpu_compare import (  # noqa: E402
    PARAMS,
    _assert_matches,
    _cpu_detections,
    _nv12,
    _scene,
)

from vdet.config.gpu import GpuSettings  # noqa: E402
from vdet.core.assets import asset_path  # noqa: E402
from vdet.core.types import ColourMatrix, ColourRange  # noqa: E402
from vdet.gpu.devices import GpuDevice, choose_ops  # noqa: E402
from vdet.gpu.frame_ops import Nv12Geometry  # noqa: E402
from vdet.gpu.graphs import CudaGraphRunner, RunnerOptions  # noqa: E402
from vdet.gpu.input_shapes import InputShapes  # noqa: E402
from vdet.inference.backends.onnxruntime import OnnxRuntimeBackend  # noqa: E402
from vdet.inference.backends.torch import TorchBackend  # noqa: E402
from vdet.inference.detector import Detector  # noqa: E402
from vdet.ingest.nvdec import GpuVideoFrame  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("always")]

DEMO = asset_path("demo.onnx")
MODEL_HW = (640, 640)
DEVICE = torch.device("cuda", 0)


@pytest.fixture(scope="module")
def backend() -> Iterator[TorchBackend]:
    with TorchBackend(DEMO) as made:
        assert made.rect_networks
        yield made


@pytest.fixture(scope="module")
def detector() -> Iterator[Detector]:
    with Detector(OnnxRuntimeBackend(DEMO), input_shape="rect") as made:
        yield made


def _ops() -> dict[str, Any]:
    preprocess, decode_nms, _ = choose_ops("auto", DEVICE)
    return {"preprocess": preprocess, "decode_nms": decode_nms}


def _geometry(size_wh: tuple[int, int], input_hw: tuple[int, int]) -> Nv12Geometry:
    return Nv12Geometry.of(size_wh, input_hw, ColourMatrix.BT601, ColourRange.LIMITED)


def _frame(source: str, index: int, seed: int, size_wh: tuple[int, int]) -> GpuVideoFrame:
    nv12 = _nv12(_scene(seed, size_wh))
    w, h = size_wh
    return GpuVideoFrame(
        source_id=source,
        index=index,
        pts_seconds=index / 30,
        arrival_time=0.0,
        decode_seconds=0.0,
        width=w,
        height=h,
        nv12=torch.from_numpy(nv12).to(DEVICE),
        matrix=ColourMatrix.BT601,
        colour_range=ColourRange.LIMITED,
        stream=None,
        ready=None,
    )


@pytest.mark.parametrize(
    ("size_wh", "input_hw"),
    [((1280, 720), (384, 640)), ((1920, 1080), (384, 640)), ((640, 480), (480, 640))],
)
def test_a_graph_runner_at_a_rect_input_matches_the_cpu_detector(
    backend: TorchBackend,
    detector: Detector,
    size_wh: tuple[int, int],
    input_hw: tuple[int, int],
) -> None:
    """One graph per rect shape: captured once, replayed for every frame, no eager fallback;
    the head has the shape's anchors; detections twins of the CPU detector's at the same
    rect input."""
    assert detector.input_hw(size_wh) == input_hw
    fallbacks: list[int] = []
    runner = CudaGraphRunner(
        backend.network_for(1, input_hw),
        input_hw=input_hw,
        options=RunnerOptions(on_eager_fallback=lambda: fallbacks.append(1), **_ops()),
    )
    geometry = _geometry(size_wh, input_hw)
    try:
        for seed in range(200, 204):
            nv12 = _nv12(_scene(seed, size_wh))
            result = runner.run(torch.from_numpy(nv12).to(DEVICE), geometry, PARAMS)
            assert result.replayed
            _assert_matches(result.detections, _cpu_detections(nv12, geometry, detector))
        assert runner.captures == 1 and runner.eager_runs == 0 and fallbacks == []
        (slot_key,) = runner.cached_keys
        H, W = input_hw
        anchors = (H // 8) * (W // 8) + (H // 16) * (W // 16) + (H // 32) * (W // 32)
        slot = runner._slots.get(slot_key)
        assert slot is not None and slot.raw is not None
        assert tuple(slot.raw.shape) == (1, 10, anchors)
    finally:
        runner.close()


def _worker(backend: TorchBackend, **settings: Any) -> GpuDevice:
    return GpuDevice(
        DEVICE,
        backend.network_for,
        input_hw=MODEL_HW,
        dtype=backend.dtype,
        settings=GpuSettings(**settings),
        channels_last=backend.channels_last,
        input_shapes=InputShapes(MODEL_HW, backend.info.stride, rect=True),
    )


def test_a_streams_runner_follows_its_resolution_on_the_gpu(
    backend: TorchBackend, detector: Detector
) -> None:
    """Per-stream worker: 720p runs at 384x640, then 4:3 at 480x640 (the runner rebuilt), then
    720p again; every frame replayed and twin to the CPU detector's."""
    worker = _worker(backend)
    try:
        for index, size_wh in enumerate([(1280, 720), (640, 480), (1280, 720)]):
            frame = _frame("cam", index, 300 + index, size_wh)
            detections, _ = worker.detect("cam", frame, PARAMS)
            input_hw = detector.input_hw(size_wh)
            assert worker.runner_shape("cam") == input_hw
            expected = _cpu_detections(
                frame.nv12.cpu().numpy(), _geometry(size_wh, input_hw), detector
            )
            _assert_matches(detections, expected)
        assert worker.runner_rebuilds == 2
    finally:
        worker.close()


def test_a_batched_worker_with_mixed_1080p_and_4_3_sources(
    backend: TorchBackend, detector: Detector
) -> None:
    """gpu.batch 4, two 1080p and two 640x480 streams submitting from their own threads: one
    batcher per shape (384x640, 480x640), batches of one shape that several streams share,
    every frame's detections twins of the CPU detector's at its rect input."""
    worker = _worker(backend, batch=4, batch_wait_ms=20)
    sizes = {"hd0": (1920, 1080), "hd1": (1920, 1080), "tv0": (640, 480), "tv1": (640, 480)}
    per_source = 6
    frames = {
        source: [_frame(source, i, 400 + 10 * n + i, size) for i in range(per_source)]
        for n, (source, size) in enumerate(sizes.items())
    }
    got: dict[tuple[str, int], Any] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(len(sizes))

    def stream(source: str) -> None:
        start.wait()
        try:
            for i, frame in enumerate(frames[source]):
                got[source, i] = worker.detect(source, frame, PARAMS)[0]
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=stream, args=(s,)) for s in sizes]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
        assert errors == []
        assert sorted(worker.batched_shapes) == [(384, 640), (480, 640)]
        for shape in ((384, 640), (480, 640)):
            batcher = worker._batchers[shape]
            assert batcher.runner.input_hw == shape
            assert batcher.frames == 2 * per_source
            assert batcher.batches < batcher.frames
            assert batcher.runner.eager_runs == 0
        for (source, i), detections in got.items():
            size_wh = sizes[source]
            geometry = _geometry(size_wh, detector.input_hw(size_wh))
            nv12 = frames[source][i].nv12.cpu().numpy()
            _assert_matches(detections, _cpu_detections(nv12, geometry, detector))
    finally:
        worker.close()
