"""The GPU device's batcher on the CPU: frames submitted from many threads at once are staged
by their own threads into one batch, run together, and each thread gets its own frame's
detections, equal to the per-frame runner's; a frame that fails to stage fails alone; a closed
batcher refuses frames. The runners run eagerly here (CPU torch has no CUDA graphs): the
protocol between threads is what is under test, the graphs are tested in
tests/gpu/test_gpu_graphs.py and on the GPU."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import pytest
import torch
from support.toy_network import toy_network as _network

from vdet.core.types import ColourMatrix, ColourRange
from vdet.gpu.batcher import Batcher
from vdet.gpu.frame_ops import Nv12Geometry, nv12_letterbox_reference
from vdet.gpu.graphs import (
    BatchedGraphRunner,
    CudaGraphRunner,
    RunnerOptions,
    as_numpy_rows,
)
from vdet.inference.postprocess import PostprocessParams
from vdet.ingest.nvdec import GpuVideoFrame

INPUT_HW = (64, 64)
LOOSE = PostprocessParams(conf_threshold=0.3, iou_threshold=0.5, max_det=10)
STRICT = PostprocessParams(conf_threshold=0.6, iou_threshold=0.5, max_det=10)
SIZES = [(96, 48), (64, 64), (128, 32), (64, 96), (80, 48)]


def _frame(source: int, index: int) -> GpuVideoFrame:
    w, h = SIZES[(source + index) % len(SIZES)]
    rng = np.random.default_rng(100 * source + index)
    nv12 = rng.integers(0, 256, (h * 3 // 2, w), dtype=np.uint8)
    nv12[:h] = np.clip(nv12[:h].astype(int) // 2 + 23 * index, 0, 255)
    return GpuVideoFrame(
        source_id=f"cam{source}",
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


def _batched(preprocess: Callable[..., None] = nv12_letterbox_reference) -> BatchedGraphRunner:
    return BatchedGraphRunner(
        _network,
        input_hw=INPUT_HW,
        batch=4,
        options=RunnerOptions(
            dtype=torch.float32,
            device="cpu",
            preprocess=preprocess,
            channels_last=False,
            use_graphs=False,
        ),
        network_for_batch=lambda size: _network,
    )


def _expected(frame: GpuVideoFrame, params: PostprocessParams) -> np.ndarray:
    single = CudaGraphRunner(
        _network,
        input_hw=INPUT_HW,
        options=RunnerOptions(
            dtype=torch.float32, device="cpu", channels_last=False, use_graphs=False
        ),
    )
    return as_numpy_rows(single.run_frame(frame, params))


def test_frames_from_many_threads_are_batched_and_each_gets_its_own_detections() -> None:
    batcher = Batcher(_batched(), wait_s=0.05, name="test-batcher")
    sources, per_source = 6, 5
    got: dict[tuple[int, int], np.ndarray] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(sources)

    def stream(source: int) -> None:
        params = LOOSE if source % 2 else STRICT  # two params: never in one batch
        start.wait()
        try:
            for index in range(per_source):
                got[source, index] = as_numpy_rows(batcher.submit(_frame(source, index), params))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=stream, args=(s,)) for s in range(sources)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    batcher.close()
    assert errors == []
    assert batcher.frames == sources * per_source
    assert batcher.batches < batcher.frames  # frames of several streams shared batches
    for (source, index), rows in got.items():
        params = LOOSE if source % 2 else STRICT
        np.testing.assert_allclose(rows, _expected(_frame(source, index), params), atol=1e-5)


def test_a_frame_that_fails_to_stage_fails_alone() -> None:
    def preprocess(
        nv12: torch.Tensor, geometry: Nv12Geometry, out: torch.Tensor, s: object
    ) -> None:
        if geometry.source_wh == SIZES[2]:
            raise RuntimeError("bad frame")
        nv12_letterbox_reference(nv12, geometry, out, None)

    batcher = Batcher(_batched(preprocess), wait_s=0.2, name="test-batcher")
    outcomes: dict[int, object] = {}
    start = threading.Barrier(3)

    def stream(source: int) -> None:
        start.wait()
        try:
            outcomes[source] = as_numpy_rows(batcher.submit(_frame(source, 0), LOOSE))
        except RuntimeError as exc:
            outcomes[source] = exc

    threads = [threading.Thread(target=stream, args=(s,)) for s in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    batcher.close()
    assert isinstance(outcomes[2], RuntimeError) and "bad frame" in str(outcomes[2])
    for source in (0, 1):
        np.testing.assert_allclose(outcomes[source], _expected(_frame(source, 0), LOOSE), atol=1e-5)  # type: ignore[arg-type]


def test_a_closed_batcher_refuses_frames() -> None:
    batcher = Batcher(_batched(), wait_s=0.01, name="test-batcher")
    assert len(as_numpy_rows(batcher.submit(_frame(0, 0), LOOSE))) >= 0
    batcher.close()
    with pytest.raises(RuntimeError, match="closed"):
        batcher.submit(_frame(0, 1), LOOSE)
