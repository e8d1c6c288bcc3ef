"""The service's GPU path, on the CPU: StreamManager -> GPU device -> NVDEC reader -> graph runner.

What runs for real: the stream manager, source threads, the NVDEC reader (demux, bitstream
filters, sessions, frames), the per-stream and batched runners, placement and metrics, on the
demo model converted by onnx2torch and run by CPU torch. What stands in for what cannot exist
here: `FakeNvc` (tests/support/fake_nvc.py) decodes with FFmpeg on the CPU where PyNvVideoCodec
would use NVDEC; and CPU torch has no CUDA graphs, so `GpuTuning(cuda_graphs=False)` runs the same
work eagerly. The same flow on a real GPU is tests/gpu/test_gpu_devices_gpu.py.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnx2torch")

from support.fake_nvc import FakeNvc  # noqa: E402
from support.truth import SAMPLE, recall  # noqa: E402
from support.waiting import wait_until  # noqa: E402

from vdet.config.gpu import GpuSettings  # noqa: E402
from vdet.config.streams import StreamSpec  # noqa: E402
from vdet.core.assets import asset_path  # noqa: E402
from vdet.core.types import DetectionResult  # noqa: E402
from vdet.gpu.devices import GpuDevice, GpuPool, GpuTuning, build_gpu_pool  # noqa: E402
from vdet.gpu.placement import PlacementError  # noqa: E402
from vdet.inference.backends.torch import TorchBackend  # noqa: E402
from vdet.inference.detector import Detector  # noqa: E402
from vdet.ingest.nvdec import GpuVideoFrame  # noqa: E402
from vdet.metrics.registry import Metrics  # noqa: E402
from vdet.results.hub import ResultsHub  # noqa: E402
from vdet.streams.manager import StreamManager  # noqa: E402
from vdet.streams.service import StreamChanges  # noqa: E402

DEMO = asset_path("demo.onnx")


@pytest.fixture(scope="module")
def cpu_backend() -> Iterator[TorchBackend]:
    backend = TorchBackend(DEMO, device="cpu", cuda_graph=False)
    yield backend
    backend.close()


@pytest.fixture(scope="module")
def detector() -> Iterator[Detector]:
    with Detector.open(DEMO, "onnxruntime") as d:
        yield d


CPU_TUNING = GpuTuning(ops="torch", cuda_graphs=False)


def _worker(backend: TorchBackend, index: int = 0, **settings: Any) -> GpuDevice:
    return GpuDevice(
        "cpu",
        backend.network_for,
        input_hw=backend.info.input_hw,
        dtype=torch.float32,
        settings=GpuSettings(**settings),
        tuning=CPU_TUNING,
        nvc=FakeNvc(),
        index=index,
    )


def _manager(
    detector: Detector, pool: GpuPool, metrics: Metrics | None = None
) -> tuple[StreamManager, ResultsHub, Metrics]:
    hub = ResultsHub(capacity_per_source=64, capacity_total=512)
    metrics = metrics or Metrics()
    manager = StreamManager(detector, detector.info.names, hub, metrics, max_streams=8, gpu=pool)
    return manager, hub, metrics


def _as_dicts(result: DetectionResult) -> list[dict[str, Any]]:
    d = result.detections
    return [
        {"class_id": int(c), "box": [float(v) for v in box]}
        for box, c in zip(d.xyxy, d.class_ids, strict=True)
    ]


def test_a_stream_on_a_gpu_worker_decodes_with_nvdec_and_finds_the_clip_objects(
    cpu_backend: TorchBackend, detector: Detector
) -> None:
    pool = GpuPool([_worker(cpu_backend)])
    manager, hub, metrics = _manager(detector, pool)
    try:
        # Looping: under load a single pass may end before 16 frames got through.
        manager.add(StreamSpec(id="cam", url=str(SAMPLE), realtime=False, loop=True))
        wait_until(lambda: manager.get("cam").frames_processed >= 16, 300, what="16 results")
        snap = manager.snapshot("cam")
        assert snap is not None and isinstance(snap.frame, GpuVideoFrame)
        results = hub.since(0, "cam")
        # Frame indexes count on across loops; the truth is looked up modulo the clip. Over
        # sixteen frames (the mailbox skips what CPU torch is too slow for) one small or
        # half-hidden object moves recall by a few points: 0.85 here, 0.9 over whole clips.
        assert recall([(r.frame_index, _as_dicts(r)) for r in results]) >= 0.85
        image = manager.snapshot_image("cam")
        assert image is not None
        bgr, result = image
        assert bgr.shape == (1080, 1920, 3) and bgr.dtype == np.uint8
        assert result.seq == snap.result.seq
        manager.sync_metrics()
        text = metrics.render().decode()
        assert 'vdet_source_gpu{gpu="0",source="cam"} 1.0' in text
        assert 'vdet_gpu_streams{gpu="0"} 1.0' in text
        assert 'vdet_gpu_frames_processed_total{gpu="0"}' in text
    finally:
        manager.close()
        pool.close()


def test_gpu_path_matches_the_cpu_path_on_the_same_frame(
    cpu_backend: TorchBackend, detector: Detector
) -> None:
    """NV12 -> letterbox on the 'GPU' against PyAV's BGR -> CPU letterbox: same objects."""
    import av

    worker = _worker(cpu_backend)
    try:
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
            frame = next(f for f in reader.frames() if isinstance(f, GpuVideoFrame))
        gpu_dets, timings = worker.detect("cam", frame, detector.params)
        assert timings.inference > 0
        with av.open(str(SAMPLE)) as container:
            bgr = next(container.decode(video=0)).to_ndarray(format="bgr24")
        ((cpu_dets, _),) = detector.detect([bgr])
        assert len(gpu_dets.xyxy) == len(cpu_dets.xyxy) > 0
        # Different YUV -> RGB conversions (ours from the stream's BT.709 limited range, FFmpeg's
        # swscale) move scores by ~1e-3 and boxes by well under a pixel.
        order_gpu, order_cpu = np.argsort(gpu_dets.xyxy[:, 0]), np.argsort(cpu_dets.xyxy[:, 0])
        np.testing.assert_array_equal(gpu_dets.class_ids[order_gpu], cpu_dets.class_ids[order_cpu])
        np.testing.assert_allclose(gpu_dets.xyxy[order_gpu], cpu_dets.xyxy[order_cpu], atol=2.0)
        # The snapshot conversion is the same frame FFmpeg gives, within rounding.
        diff = np.abs(worker.to_bgr(frame).astype(int) - bgr.astype(int))
        assert diff.mean() < 2.0
    finally:
        worker.close()


def test_batched_worker_serves_several_streams_with_their_own_thresholds(
    cpu_backend: TorchBackend, detector: Detector
) -> None:
    pool = GpuPool([_worker(cpu_backend, batch=3, batch_wait_ms=20)])
    manager, _, _ = _manager(detector, pool)
    try:
        for i in range(3):
            manager.add(StreamSpec(id=f"cam{i}", url=str(SAMPLE), realtime=False, loop=True))
        manager.change("cam2", StreamChanges(conf_threshold=0.99))
        wait_until(
            lambda: all(manager.get(f"cam{i}").frames_processed >= 3 for i in range(3)),
            180,
            what="3 results per stream",
        )
        for i in (0, 1):
            snap = manager.snapshot(f"cam{i}")
            assert snap is not None and len(snap.result.detections.xyxy) > 0
        snap = manager.snapshot("cam2")
        assert snap is not None
        assert all(s >= 0.99 for s in snap.result.detections.scores)
        batcher = pool.devices[0]._batchers[cpu_backend.info.input_hw]
        assert batcher.frames >= 9
    finally:
        manager.close()
        pool.close()


def test_a_batching_worker_takes_two_frames_of_a_stream_at_once_and_keeps_their_order(
    cpu_backend: TorchBackend, detector: Detector
) -> None:
    worker = _worker(cpu_backend, batch=2, batch_wait_ms=20)
    assert worker.frames_in_flight == 2
    assert _worker(cpu_backend).frames_in_flight == 1  # a stream's own runner: one at a time
    pool = GpuPool([worker])
    in_detection: list[int] = []
    most = 0
    lock = threading.Lock()
    detect = worker.detect

    def counted(source_id: str, frame: GpuVideoFrame, params: Any) -> Any:
        nonlocal most
        with lock:
            in_detection.append(frame.index)
            most = max(most, len(in_detection))
        try:
            return detect(source_id, frame, params)
        finally:
            with lock:
                in_detection.remove(frame.index)

    worker.detect = counted  # type: ignore[method-assign]
    manager, hub, _ = _manager(detector, pool)
    try:
        manager.add(StreamSpec(id="cam", url=str(SAMPLE), realtime=False))
        wait_until(lambda: manager.get("cam").frames_processed >= 8, 180, what="8 results")
        published = [result.frame_index for result in hub.since(0, "cam")]
    finally:
        manager.close()
        pool.close()
    assert most == 2
    assert published == sorted(published)
    # Not paced: every frame is detected, in order, none skipped.
    assert published[:8] == list(range(8))


def test_streams_spread_over_gpus_and_pinned_streams_stay_where_asked(
    cpu_backend: TorchBackend, detector: Detector
) -> None:
    pool = GpuPool([_worker(cpu_backend, index=0), _worker(cpu_backend, index=1)])
    manager, _, metrics = _manager(detector, pool)
    try:
        for name in ("a", "b", "c"):
            manager.add(StreamSpec(id=name, url=str(SAMPLE), realtime=True, loop=True))
        manager.add(StreamSpec(id="pinned", url=str(SAMPLE), realtime=True, gpu=0))
        # a -> 0, b -> 1, c -> 0 (a tie goes to the lower index), pinned -> 0 as asked; placed
        # streams never move to even out the load.
        assert pool.streams_by_gpu() == {"0": 3, "1": 1}
        assert pool.device_of("pinned").index == 0
        with pytest.raises(PlacementError, match="gpu 5"):
            manager.add(StreamSpec(id="nowhere", url=str(SAMPLE), gpu=5))
        assert "nowhere" not in manager
        manager.remove("a")
        assert sum(pool.streams_by_gpu().values()) == 3
        manager.sync_metrics()
        text = metrics.render().decode()
        assert 'vdet_gpu_streams{gpu="1"}' in text and 'source="a"' not in text
    finally:
        manager.close()
        pool.close()


def test_a_failing_gpu_worker_fails_only_its_own_streams(
    cpu_backend: TorchBackend, detector: Detector
) -> None:
    broken_calls = threading.Event()

    def broken_network(batch: int, input_hw: tuple[int, int]) -> Any:
        def run(x: Any) -> Any:
            broken_calls.set()
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

        return run

    broken = GpuDevice(
        "cpu",
        broken_network,
        input_hw=cpu_backend.info.input_hw,
        dtype=torch.float32,
        settings=GpuSettings(),
        tuning=CPU_TUNING,
        nvc=FakeNvc(),
        index=1,
    )
    pool = GpuPool([_worker(cpu_backend, index=0), broken])
    manager, _, _ = _manager(detector, pool)
    try:
        manager.add(StreamSpec(id="good", url=str(SAMPLE), realtime=False, gpu=0))
        manager.add(StreamSpec(id="bad", url=str(SAMPLE), realtime=False, gpu=1))
        wait_until(lambda: manager.get("good").frames_processed >= 2, 120, what="good results")
        wait_until(lambda: manager.get("bad").pipeline_error, 60, what="bad stream's error")
        assert broken_calls.is_set()
        assert manager.get("bad").frames_processed == 0
        assert "illegal memory access" in (manager.get("bad").pipeline_error or "")
    finally:
        manager.close()
        pool.close()


def test_gpu_pool_is_built_from_what_the_backend_declares(
    cpu_backend: TorchBackend, detector: Detector
) -> None:
    """The abilities `build_gpu_pool` reads (no backend types there): the torch backend
    declares its networks' dtype, layout and shapes; a CPU-path backend declares none and is
    refused."""
    assert cpu_backend.network_dtype == torch.float32  # CPU torch: FP32
    assert cpu_backend.network_channels_last is True
    assert cpu_backend.rect_networks is True and cpu_backend.network_min_hw is None
    assert cpu_backend.network_for(1, (640, 640)) is cpu_backend.network_for_batch(1)
    ort = detector.backend
    assert not ort.gpu_data_path and not ort.rect_networks
    with pytest.raises(NotImplementedError, match="GPU data path"):
        ort.network_for(1, (640, 640))
    with pytest.raises(NotImplementedError, match="GPU data path"):
        ort.replica(0)
    with pytest.raises(TypeError, match="does not feed the GPU data path"):
        build_gpu_pool(GpuSettings(), ort)
