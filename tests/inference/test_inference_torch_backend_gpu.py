"""The torch backend and the CUDA-graph runners on the GPU, against ONNX Runtime on the CPU.

Needs a CUDA GPU and onnx2torch (skipped otherwise; not PyAV, not torchvision, not
ultralytics). Inputs are the project's synthetic scenes (vdet.modelkit.dataset.synthetic: numpy +
cv2), on which the demo model detects reliably; NV12 frames are made from them on the host with
OpenCV, so the runner's input and the CPU reference's input are the very same pixels.

FP16 tolerances (the network runs in float16 on the GPU, ONNX Runtime in float32):
raw head boxes within 2 px (coordinates up to 640, float16 spacing 0.5 there, plus
accumulated rounding), class scores within 0.02; after NMS every reference detection
scoring >= 0.5 has a "twin": same class, score within 0.03, and IoU >= 0.85 or every corner
within 4 px (source pixels are up to 3x input pixels, so 1 px of float16 error in a 16 px box
alone can cost IoU 0.1). Graph replay against eager execution of the same kernels, and
concurrent against sequential runs: the same rows within 1e-3 (expected bit for bit), or, if
a borderline box flipped, twins both ways for every detection scoring >= 0.3.

Written against torch 2.11.0+cu130, onnxruntime 1.30 with the CPU provider only and
opencv-python-headless 5.0; what the graphs cost on a GPU is measured by bench/gpu/pipeline.py
(bench/results/2026-12-02-gpu-pipeline-h200.json), not here.
Warnings are reported, not raised, here: this suite runs only where a GPU is, seldom.
"""

from __future__ import annotations

import threading
import warnings

import numpy as np
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
    _geometry,
    _nv12,
    _scene,
)

from vdet.core.assets import asset_path  # noqa: E402
from vdet.gpu.frame_ops import Nv12Geometry, kernel_ops  # noqa: E402
from vdet.gpu.graphs import (  # noqa: E402
    BatchedGraphRunner,
    CudaGraphRunner,
    RunnerOptions,
    RunResult,
    as_numpy_rows,
)
from vdet.inference.backends import create_backend  # noqa: E402
from vdet.inference.backends.onnxruntime import OnnxRuntimeBackend  # noqa: E402
from vdet.inference.backends.torch import TorchBackend  # noqa: E402
from vdet.inference.detector import Detector  # noqa: E402
from vdet.inference.postprocess import decode_and_nms_image  # noqa: E402
from vdet.inference.preprocess import letterbox  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("always")]

DEMO = asset_path("demo.onnx")
SIZES = [(1280, 720), (640, 480)]


@pytest.fixture(scope="module")
def backend() -> TorchBackend:
    with TorchBackend(DEMO) as made:
        yield made  # type: ignore[misc]


@pytest.fixture(scope="module")
def reference() -> OnnxRuntimeBackend:
    return OnnxRuntimeBackend(DEMO)


def _assert_same_results(got: RunResult, expected: RunResult) -> None:
    a, b = as_numpy_rows(got), as_numpy_rows(expected)
    if a.shape == b.shape:
        np.testing.assert_allclose(a, b, atol=1e-3)
        return
    _assert_matches(got.detections, expected.detections, min_score=0.3)
    _assert_matches(expected.detections, got.detections, min_score=0.3)


def test_backend_is_a_captured_fp16_graph(backend: TorchBackend) -> None:
    assert backend.graph_failure is None
    assert "fp16" in backend.device and "cuda graph" in backend.device
    assert backend.max_batch == 1


def test_backend_matches_onnxruntime(backend: TorchBackend, reference: OnnxRuntimeBackend) -> None:
    for seed in range(4):
        batch, _ = letterbox(_scene(seed), (640, 640))
        raw = backend.infer(batch[None])
        expected = reference.infer(batch[None])
        assert raw.shape == expected.shape == (1, 10, 8400)
        np.testing.assert_allclose(raw[:, :4], expected[:, :4], atol=2.0, rtol=0)
        np.testing.assert_allclose(raw[:, 4:], expected[:, 4:], atol=0.02, rtol=0)
        _assert_matches(
            decode_and_nms_image(raw[0], PARAMS)[0], decode_and_nms_image(expected[0], PARAMS)[0]
        )


def test_backend_batches_are_split_and_padded(backend: TorchBackend) -> None:
    images = np.stack([letterbox(_scene(seed), (640, 640))[0] for seed in range(6)])
    with TorchBackend(DEMO, batch=4) as batched:
        assert batched.max_batch == 4 and batched.graph_failure is None
        raw = batched.infer(images)  # a batch of 4 and a padded batch of 2
    single = np.concatenate([backend.infer(image[None]) for image in images])
    np.testing.assert_allclose(raw[:, :4], single[:, :4], atol=1.0, rtol=0)
    np.testing.assert_allclose(raw[:, 4:], single[:, 4:], atol=0.01, rtol=0)


def test_auto_chooses_torch_on_cuda() -> None:
    with create_backend("auto", DEMO) as chosen:
        assert chosen.name in ("torch", "tensorrt")  # tensorrt only where it is installed


def _runner(backend: TorchBackend, **kwargs: object) -> CudaGraphRunner:
    options = RunnerOptions(**kwargs)  # type: ignore[arg-type]
    return CudaGraphRunner(backend.network, input_hw=(640, 640), options=options)


def _frames(count: int, offset: int = 0) -> list[tuple[np.ndarray, Nv12Geometry]]:
    out = []
    for i in range(count):
        w, h = SIZES[i % len(SIZES)]
        out.append((_nv12(_scene(100 + offset + i, (w, h))), _geometry(w, h)))
    return out


def _run(runner: CudaGraphRunner, nv12: np.ndarray, geometry: Nv12Geometry) -> RunResult:
    return runner.run(torch.from_numpy(nv12).cuda(), geometry, PARAMS)


def test_graph_replay_equals_eager(backend: TorchBackend) -> None:
    fallbacks: list[int] = []
    graphed = _runner(backend, on_eager_fallback=lambda: fallbacks.append(1))
    eager = _runner(backend, use_graphs=False)
    for nv12, geometry in _frames(6):
        replayed, plain = _run(graphed, nv12, geometry), _run(eager, nv12, geometry)
        assert replayed.replayed and not plain.replayed
        assert len(plain.detections) > 0
        _assert_same_results(replayed, plain)
    assert graphed.captures == 2  # one graph per frame size
    assert graphed.eager_runs == 0 and fallbacks == []


def test_runner_matches_the_cpu_pipeline(backend: TorchBackend) -> None:
    runner = _runner(backend)
    with Detector(OnnxRuntimeBackend(DEMO)) as detector:
        for nv12, geometry in _frames(4, offset=10):
            result = _run(runner, nv12, geometry)
            _assert_matches(result.detections, _cpu_detections(nv12, geometry, detector))


def test_sources_on_their_own_streams_concurrently_equal_sequential(backend: TorchBackend) -> None:
    sources = 4
    frames = {s: _frames(5, offset=20 + 10 * s) for s in range(sources)}

    def run_all(runner: CudaGraphRunner, source: int, out: dict[int, list[RunResult]]) -> None:
        out[source] = [_run(runner, nv12, g) for nv12, g in frames[source]]

    sequential: dict[int, list[RunResult]] = {}
    for s in range(sources):
        run_all(_runner(backend), s, sequential)
    concurrent: dict[int, list[RunResult]] = {}
    runners = [_runner(backend) for _ in range(sources)]
    threads = [
        threading.Thread(target=run_all, args=(runners[s], s, concurrent)) for s in range(sources)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert sorted(concurrent) == list(range(sources))
    for s in range(sources):
        for got, expected in zip(concurrent[s], sequential[s], strict=True):
            assert got.replayed
            _assert_same_results(got, expected)
    assert all(r.eager_runs == 0 for r in runners)


def test_batched_runner_matches_per_source_runners(backend: TorchBackend) -> None:
    batched = BatchedGraphRunner(backend.network_for_batch(4), input_hw=(640, 640), batch=4)
    single = _runner(backend)
    frames = _frames(3, offset=40)
    for _ in range(2):
        inputs = [(torch.from_numpy(nv12).cuda(), g, None) for nv12, g in frames]
        results = batched.run_batch(inputs, PARAMS)
        assert all(r.replayed for r in results)
        for result, (nv12, geometry) in zip(results, frames, strict=True):
            _assert_matches(result.detections, _run(single, nv12, geometry).detections)
    assert batched.captures == 1


def test_batched_runner_buckets_match_per_source_runners(backend: TorchBackend) -> None:
    """A graph per batch-size bucket: 1, 3 and 5 frames replay buckets 1, 4 and 8."""
    batched = BatchedGraphRunner(
        backend.network_for_batch(8),
        input_hw=(640, 640),
        batch=8,
        network_for_batch=backend.network_for_batch,
    )
    single = _runner(backend)
    frames = _frames(5, offset=60)
    for n in (1, 3, 5, 3):
        inputs = [(torch.from_numpy(nv12).cuda(), g, None) for nv12, g in frames[:n]]
        results = batched.run_batch(inputs, PARAMS)
        assert len(results) == n and all(r.replayed for r in results)
        for result, (nv12, geometry) in zip(results, frames, strict=False):
            _assert_matches(result.detections, _run(single, nv12, geometry).detections)
    assert batched.captures == 3 and len(batched.cached_keys) == 3  # buckets 1, 4 and 8


def test_nvdec_frames_through_the_runner(backend: TorchBackend) -> None:
    """End to end on the GPU: NVDEC frames of the sample clip -> one graph per frame."""
    pytest.importorskip("PyNvVideoCodec")
    from vdet.ingest.nvdec import decode_file

    sample = DEMO.parent / "sample.mp4"
    runner = _runner(backend)
    with Detector(OnnxRuntimeBackend(DEMO)) as detector:
        for i, frame in enumerate(decode_file(str(sample))):
            if i % 10:
                continue
            result = runner.run_frame(frame, PARAMS)
            assert result.replayed
            frame.wait(torch.cuda.current_stream())
            geometry = Nv12Geometry.of(frame.size_wh, (640, 640), frame.matrix, frame.colour_range)
            expected = _cpu_detections(frame.nv12.cpu().numpy(), geometry, detector)
            if (expected.scores >= 0.5).any():
                _assert_matches(result.detections, expected)
            if i >= 100:
                break
    assert runner.captures == 1


def test_runner_with_the_cuda_kernels(backend: TorchBackend) -> None:
    """The vdet/cuda/kernels/ kernels (letterbox, decode + NMS) in the same graph, against the
    torch ops.

    The kernels are tested on their own in test_gpu_kernels.py; here they only have to fit the
    runner: captured once per shape, and detections twins of the reference ops' ones.
    """
    try:
        preprocess, decode_nms = kernel_ops()
    except Exception as exc:  # no cuda-python / NVRTC here: the kernels' own tests say why
        pytest.skip(f"CUDA kernels unavailable: {exc}")
    kernels = _runner(backend, preprocess=preprocess, decode_nms=decode_nms)
    reference = _runner(backend)
    for nv12, geometry in _frames(4, offset=60):
        got, expected = _run(kernels, nv12, geometry), _run(reference, nv12, geometry)
        assert got.replayed
        _assert_matches(got.detections, expected.detections, min_score=0.3)
        _assert_matches(expected.detections, got.detections, min_score=0.3)
    assert kernels.captures == 2 and kernels.eager_runs == 0
