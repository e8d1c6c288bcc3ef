"""The service's GPU path on a real GPU: StreamManager -> GPU device -> PyAV demux + NVDEC ->
CUDA graph of vdet's preprocess kernel, the demo model (torch FP16) and vdet's decode + NMS
kernel -> results. The same flow with stand-ins on the CPU is tests/gpu/test_gpu_devices.py.

Needs a CUDA GPU, PyNvVideoCodec, PyAV, onnx2torch and cuda-python (skipped otherwise).

Recall: the serve path is scored on the frames it published against the CPU path (FFmpeg
decode, ONNX Runtime FP32) on exactly those frames, and must not fall more than 2 points
behind it; which frames a run publishes varies (the mailbox skips frames while the GPU warms
up), and their recall with them (0.88 to 1.0 on the clip's early frames). bench/gpu/accuracy.py
scored all 300 frames through the GPU path in FP16 and FP32 and through the CPU path
(bench/results/2026-12-02-accuracy-fp16-fp32-h200.json): FP16 costs nothing here. An
absolute floor (0.85) still catches a broken frame, colour or box mapping, which scores near 0.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.tools import REPO

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    pytest.importorskip("PyNvVideoCodec")
pytest.importorskip("av")
pytest.importorskip("onnx2torch")
pytest.importorskip("cuda.bindings")

from support import truth  # noqa: E402

from vdet.config.gpu import GpuSettings  # noqa: E402
from vdet.config.streams import StreamSpec  # noqa: E402
from vdet.core.assets import assets_dir  # noqa: E402
from vdet.core.types import DetectionResult  # noqa: E402
from vdet.gpu.devices import GpuPool, GpuTuning, build_gpu_pool  # noqa: E402
from vdet.inference.detector import Detector  # noqa: E402
from vdet.ingest.nvdec import GpuVideoFrame  # noqa: E402
from vdet.metrics.registry import Metrics  # noqa: E402
from vdet.results.hub import ResultsHub  # noqa: E402
from vdet.streams.manager import StreamManager  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.filterwarnings("always")]

ROOT = REPO
DEMO = ROOT / "service" / "vdet" / "assets" / "demo.onnx"
# The installed package's own clip: the one file source the default source policy allows.
SAMPLE = assets_dir() / "sample.mp4"
RECALL_FLOOR = 0.85  # a broken mapping scores near 0 (module docstring)


@pytest.fixture(scope="module")
def detector() -> Iterator[Detector]:
    with Detector.open(DEMO, "torch") as d:
        yield d


@pytest.fixture(scope="module")
def cpu_reference() -> dict[int, list[dict[str, Any]]]:
    """The CPU path's detections of every clip frame, by frame index."""
    return {i: truth.as_dicts(d) for i, d in truth.cpu_path_detections().items()}


def _check_recall(
    results: list[DetectionResult], reference: dict[int, list[dict[str, Any]]]
) -> None:
    ours = _recall(results)
    theirs = truth.recall([(r.frame_index, reference[r.frame_index]) for r in results])
    assert ours >= RECALL_FLOOR, (ours, theirs)
    assert ours >= theirs - 0.02, f"GPU path {ours:.3f} against the CPU path's {theirs:.3f}"


def _run(detector: Detector, settings: GpuSettings, streams: int, frames: int) -> dict[str, Any]:
    pool = build_gpu_pool(settings, detector.backend, tuning=GpuTuning(ops="cuda"))
    metrics = Metrics()
    hub = ResultsHub(capacity_per_source=1024, capacity_total=8192)
    manager = StreamManager(
        detector, detector.info.names, hub, metrics, max_streams=streams, gpu=pool
    )
    try:
        ids = [f"cam{i}" for i in range(streams)]
        for stream_id in ids:
            manager.add(StreamSpec(id=stream_id, url=str(SAMPLE), realtime=False))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if all(manager.get(i).frames_processed >= frames for i in ids):
                break
            time.sleep(0.05)
        views = {i: manager.get(i) for i in ids}
        snapshot = manager.snapshot(ids[0])
        image = manager.snapshot_image(ids[0])
        manager.sync_metrics()
        return {
            "views": views,
            "results": {i: hub.since(0, i) for i in ids},
            "snapshot": snapshot,
            "image": image,
            "metrics": metrics.render().decode(),
            "pool": pool,
        }
    finally:
        manager.close()
        pool.close()


def _recall(results: list[DetectionResult]) -> float:
    # NVDEC decodes the file from its first frame; the result's index is the clip's frame.
    return float(truth.recall([(r.frame_index, truth.as_dicts(r.detections)) for r in results]))


def test_one_stream_finds_the_clip_objects_through_graphs_and_our_kernels(
    detector: Detector, cpu_reference: dict[int, list[dict[str, Any]]]
) -> None:
    out = _run(detector, GpuSettings(), streams=1, frames=60)
    view = out["views"]["cam0"]
    assert view.pipeline_error is None and view.frames_processed >= 60
    assert isinstance(out["snapshot"].frame, GpuVideoFrame)
    _check_recall(out["results"]["cam0"], cpu_reference)
    assert "vdet_inference_eager_fallbacks_total 0.0" in out["metrics"]
    assert 'vdet_source_gpu{gpu="0",source="cam0"} 1.0' in out["metrics"]
    bgr, _ = out["image"]
    assert bgr.shape == (1080, 1920, 3) and bgr.dtype == np.uint8 and bgr.std() > 10


def test_batched_streams_find_the_same_objects(
    detector: Detector, cpu_reference: dict[int, list[dict[str, Any]]]
) -> None:
    settings = GpuSettings(batch=4, batch_wait_ms=2)
    out = _run(detector, settings, streams=4, frames=30)
    for stream_id, view in out["views"].items():
        assert view.pipeline_error is None and view.frames_processed >= 30, stream_id
        _check_recall(out["results"][stream_id], cpu_reference)
    assert "vdet_inference_eager_fallbacks_total 0.0" in out["metrics"]


def test_torch_reference_ops_and_our_kernels_agree_on_a_decoded_frame(detector: Detector) -> None:
    from vdet.gpu.devices import GpuDevice

    workers = []
    detections = []
    for ops in ("cuda", "torch"):
        pool = build_gpu_pool(GpuSettings(), detector.backend, tuning=GpuTuning(ops=ops))
        assert isinstance(pool, GpuPool)
        worker: GpuDevice = pool.devices[0]
        workers.append(pool)
        reader = worker.open_reader(
            str(SAMPLE),
            source_id="cam",
            connect_timeout_s=5,
            read_timeout_s=5,
            loop=False,
            realtime=False,
        )
        with reader:
            reader.open()
            frames = [f for _, f in zip(range(5), reader.frames(), strict=False)]
            assert all(isinstance(f, GpuVideoFrame) for f in frames)
            detections.append([worker.detect("cam", f, detector.params)[0] for f in frames])
    for pool in workers:
        pool.close()
    for ours, reference in zip(*detections, strict=True):
        assert len(ours.xyxy) == len(reference.xyxy) > 0
        np.testing.assert_array_equal(ours.class_ids, reference.class_ids)
        # FP16 network on inputs that differ by float rounding: boxes within a pixel.
        np.testing.assert_allclose(ours.xyxy, reference.xyxy, atol=1.0)
        np.testing.assert_allclose(ours.scores, reference.scores, atol=5e-3)


def test_10_bit_hevc_runs_through_p016_surfaces_and_our_kernels(
    detector: Detector, cpu_reference: dict[int, list[dict[str, Any]]], tmp_path: Path
) -> None:
    """The clip's first 30 frames as 1080p HEVC Main10: NVDEC hands out P016 surfaces, our
    preprocess kernel converts them in the CUDA graph; recall within 0.03 of the CPU path's
    on the 8-bit original (the re-encode costs a little), and the torch reference ops agree
    with our kernels on the same frames (boxes within a pixel)."""
    from vdet.gpu.devices import GpuDevice
    from vdet.modelkit.dataset.media_cases import reencode

    clip = reencode(
        SAMPLE, tmp_path / "main10.mp4", "libx265", "yuv420p10le", frames=30,
        options={"crf": "18", "x265-params": "log-level=error"},
    )  # fmt: skip
    detections = {}
    for ops in ("cuda", "torch"):
        pool = build_gpu_pool(GpuSettings(), detector.backend, tuning=GpuTuning(ops=ops))
        try:
            assert isinstance(pool, GpuPool)
            worker: GpuDevice = pool.devices[0]
            reader = worker.open_reader(
                str(clip), source_id="cam", connect_timeout_s=5, read_timeout_s=5,
                loop=False, realtime=False,
            )  # fmt: skip
            with reader:
                reader.open()
                frames = list(reader.frames())
            assert len(frames) == 30
            assert all(isinstance(f, GpuVideoFrame) and f.bits == 10 for f in frames)
            detections[ops] = [worker.detect("cam", f, detector.params)[0] for f in frames]
        finally:
            pool.close()
    ours = truth.recall([(i, truth.as_dicts(d)) for i, d in enumerate(detections["cuda"])])
    theirs = truth.recall([(i, cpu_reference[i]) for i in range(30)])
    assert ours >= RECALL_FLOOR and ours >= theirs - 0.03, (ours, theirs)
    for mine, reference in zip(detections["cuda"], detections["torch"], strict=True):
        assert len(mine.xyxy) == len(reference.xyxy)
        np.testing.assert_allclose(mine.xyxy, reference.xyxy, atol=1.0)
