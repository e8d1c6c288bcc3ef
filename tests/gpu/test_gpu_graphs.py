"""The CUDA-graph runners' logic on the CPU: graph keys and LRU, recapture, eager fallback
counting, the -1 decode + NMS fallback, batching, and the result against the CPU pipeline.

CPU torch has no CUDA graphs, so a capture function is injected: `_FakeCapture` returns a
"graph" whose replay runs the captured work again (as a real graph re-runs its kernels on the
same static buffers), and `_failing_capture` raises like a capture that hits a host sync.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from support.toy_network import toy_network as _network

from vdet.core.types import ColourMatrix, ColourRange
from vdet.gpu.frame_ops import Nv12Geometry, nv12_to_rgb_u8
from vdet.gpu.graphs import (
    BatchedGraphRunner,
    CudaGraphRunner,
    GraphCache,
    RunnerOptions,
    RunResult,
    as_numpy_rows,
    batch_buckets,
)
from vdet.inference.postprocess import PostprocessParams, decode_and_nms_image
from vdet.inference.preprocess import letterbox

INPUT_HW = (64, 64)
PARAMS = PostprocessParams(conf_threshold=0.3, iou_threshold=0.5, max_det=10)


class _FakeGraph:
    def __init__(self, work: Callable[[], None]) -> None:
        self.work = work
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1
        self.work()


class _FakeCapture:
    def __init__(self) -> None:
        self.graphs: list[_FakeGraph] = []

    def __call__(self, work: Callable[[], None], stream: object) -> _FakeGraph:
        work()  # capture records the work once, as torch.cuda.graph runs it
        self.graphs.append(_FakeGraph(work))
        return self.graphs[-1]


def _failing_capture(work: Callable[[], None], stream: object) -> _FakeGraph:
    raise RuntimeError("operation not permitted when stream is capturing")


def _frame(w: int, h: int, seed: int) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    nv12 = rng.integers(0, 256, (h * 3 // 2, w), dtype=np.uint8)
    nv12[:h] = np.clip(nv12[:h].astype(int) // 2 + 40 * seed, 0, 255)
    return torch.from_numpy(nv12)


CPU_OPTIONS = RunnerOptions(dtype=torch.float32, device="cpu", channels_last=False)


def _runner(**kwargs: Any) -> CudaGraphRunner:
    options = dataclasses.replace(CPU_OPTIONS, **kwargs)
    return CudaGraphRunner(_network, input_hw=INPUT_HW, options=options)


def _cpu_pipeline(
    nv12: torch.Tensor, geometry: Nv12Geometry, params: PostprocessParams
) -> np.ndarray:
    """The CPU path on the same pixels: 8-bit BGR -> letterbox -> network -> NMS -> source."""
    rgb = nv12_to_rgb_u8(nv12, geometry).numpy().astype(np.uint8)
    bgr = np.ascontiguousarray(rgb.transpose(1, 2, 0)[:, :, ::-1])
    batch, transform = letterbox(bgr, geometry.input_hw)
    head = _network(torch.from_numpy(batch)[None])[0].numpy()
    dets = decode_and_nms_image(head, params)[0]
    xyxy = transform.to_source(dets.xyxy)
    return np.concatenate((xyxy, dets.scores[:, None], dets.class_ids[:, None]), axis=1)


def _geometry(w: int, h: int) -> Nv12Geometry:
    return Nv12Geometry.of((w, h), INPUT_HW, ColourMatrix.BT709, ColourRange.LIMITED)


def test_graph_cache_is_an_lru() -> None:
    dropped: list[str] = []
    cache: GraphCache[str, str] = GraphCache(2, dropped.append)
    cache.put("a", "A")
    cache.put("b", "B")
    assert cache.get("a") == "A"  # a is now the most recent
    cache.put("c", "C")
    assert dropped == ["B"] and cache.keys() == ["a", "c"]
    assert "b" not in cache and cache.get("b") is None
    cache.clear()
    assert dropped == ["B", "A", "C"] and len(cache) == 0
    with pytest.raises(ValueError, match="capacity"):
        GraphCache(0)


def test_replay_matches_eager_and_the_cpu_pipeline() -> None:
    capture = _FakeCapture()
    graphs, eager = _runner(capture=capture), _runner(use_graphs=False)
    for seed in range(4):
        nv12, geometry = _frame(96, 48, seed), _geometry(96, 48)
        replayed, plain = graphs.run(nv12, geometry, PARAMS), eager.run(nv12, geometry, PARAMS)
        assert replayed.replayed and not plain.replayed
        np.testing.assert_array_equal(as_numpy_rows(replayed), as_numpy_rows(plain))
        expected = _cpu_pipeline(nv12, geometry, PARAMS)
        assert len(expected) > 0
        np.testing.assert_allclose(as_numpy_rows(replayed), expected, atol=1e-3)
    assert len(capture.graphs) == 1 and capture.graphs[0].replays == 4
    assert graphs.captures == 1 and graphs.eager_runs == 0
    assert eager.eager_runs == 4


def test_one_graph_per_shape_and_params_in_a_small_lru() -> None:
    capture = _FakeCapture()
    runner = _runner(capture=capture, cache_size=2)
    sizes = [(96, 48), (96, 48), (64, 64), (96, 48), (128, 32), (64, 64)]
    for i, (w, h) in enumerate(sizes):
        runner.run(_frame(w, h, i), _geometry(w, h), PARAMS)
    # (96, 48) captured once and reused; (64, 64) captured, evicted by (128, 32), recaptured.
    assert runner.captures == 4
    assert [key[0].source_wh for key in runner.cached_keys] == [(128, 32), (64, 64)]  # type: ignore[index]
    other = PostprocessParams(conf_threshold=0.5, max_det=10)
    runner.run(_frame(64, 64, 0), _geometry(64, 64), other)
    assert runner.captures == 5  # new thresholds: a new graph for the same shape


def test_failed_capture_runs_eagerly_counts_each_frame_and_logs_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fallbacks: list[int] = []
    runner = _runner(capture=_failing_capture, on_eager_fallback=lambda: fallbacks.append(1))
    eager = _runner(use_graphs=False)
    with caplog.at_level(logging.WARNING, logger="vdet.gpu.graphs"):
        for i, (w, h) in enumerate([(96, 48), (96, 48), (64, 64)]):
            result = runner.run(_frame(w, h, i), _geometry(w, h), PARAMS)
            expected = eager.run(_frame(w, h, i), _geometry(w, h), PARAMS)
            assert not result.replayed
            np.testing.assert_array_equal(as_numpy_rows(result), as_numpy_rows(expected))
    assert len(fallbacks) == 3 and runner.eager_runs == 3 and runner.captures == 0
    warnings = [r for r in caplog.records if "capture failed" in r.getMessage()]
    assert len(warnings) == 1
    assert "operation not permitted" in warnings[0].getMessage()
    # Configured eager is not a fallback: nothing counted.
    quiet: list[int] = []
    _runner(use_graphs=False, on_eager_fallback=lambda: quiet.append(1)).run(
        _frame(96, 48, 0), _geometry(96, 48), PARAMS
    )
    assert quiet == []


def test_inexact_decode_nms_falls_back_to_the_host_reference() -> None:
    def unproven(raw, params, out_boxes, out_count, stream) -> None:  # type: ignore[no-untyped-def]
        out_boxes.zero_()
        out_count.fill_(-1)

    runner = _runner(capture=_FakeCapture(), decode_nms=unproven)
    nv12, geometry = _frame(96, 48, 2), _geometry(96, 48)
    result = runner.run(nv12, geometry, PARAMS)
    np.testing.assert_allclose(
        as_numpy_rows(result), _cpu_pipeline(nv12, geometry, PARAMS), atol=1e-3
    )


def test_run_checks_its_input() -> None:
    runner = _runner()
    with pytest.raises(ValueError, match="nv12 must be"):
        runner.run(torch.zeros((48, 96), dtype=torch.uint8), _geometry(96, 48), PARAMS)
    with pytest.raises(ValueError, match="geometry is for input"):
        runner.run(_frame(96, 48, 0), Nv12Geometry.of((96, 48), (32, 32)), PARAMS)


def test_batched_runner_matches_the_per_frame_runner() -> None:
    capture = _FakeCapture()
    batched = BatchedGraphRunner(
        _network,
        input_hw=INPUT_HW,
        batch=4,
        options=dataclasses.replace(CPU_OPTIONS, capture=capture),
    )
    single = _runner(use_graphs=False)
    frames = [
        (_frame(w, h, i), _geometry(w, h))
        for i, (w, h) in enumerate([(96, 48), (64, 64), (128, 32)])
    ]
    for _ in range(2):
        results = batched.run_batch([(nv12, g, None) for nv12, g in frames], PARAMS)
        assert len(results) == 3 and all(r.replayed for r in results)
        for result, (nv12, geometry) in zip(results, frames, strict=True):
            expected: RunResult = single.run(nv12, geometry, PARAMS)
            np.testing.assert_allclose(as_numpy_rows(result), as_numpy_rows(expected), atol=1e-5)
    assert batched.captures == 1  # one graph for the batch, whatever the frames' sizes
    with pytest.raises(ValueError, match=r"1\.\.4 frames"):
        batched.run_batch([], PARAMS)


def test_batch_buckets_are_powers_of_two_up_to_the_batch() -> None:
    assert batch_buckets(1) == (1,)
    assert batch_buckets(8) == (1, 2, 4, 8)
    assert batch_buckets(6) == (1, 2, 4, 6)
    assert batch_buckets(16) == (1, 2, 4, 8, 16)


def test_batched_runner_replays_the_smallest_bucket_that_holds_the_frames() -> None:
    capture = _FakeCapture()
    seen: list[int] = []  # the batch each network call got

    def network_for_batch(size: int) -> Callable[[torch.Tensor], torch.Tensor]:
        def network(x: torch.Tensor) -> torch.Tensor:
            assert x.shape[0] == size, "a bucket's network gets its own batch size"
            seen.append(size)
            return _network(x)

        return network

    batched = BatchedGraphRunner(
        network_for_batch(8),
        input_hw=INPUT_HW,
        batch=8,
        options=dataclasses.replace(CPU_OPTIONS, capture=capture),
        network_for_batch=network_for_batch,
    )
    assert batched.buckets == (1, 2, 4, 8)
    single = _runner(use_graphs=False)
    sizes = [(96, 48), (64, 64), (128, 32), (64, 96), (80, 48)]
    frames = [(_frame(w, h, i), _geometry(w, h)) for i, (w, h) in enumerate(sizes)]
    for n, bucket in ((1, 1), (3, 4), (5, 8), (2, 2), (4, 4)):
        seen.clear()
        results = batched.run_batch([(nv12, g, None) for nv12, g in frames[:n]], PARAMS)
        assert set(seen) == {bucket} and len(results) == n
        for result, (nv12, geometry) in zip(results, frames, strict=False):
            expected: RunResult = single.run(nv12, geometry, PARAMS)
            np.testing.assert_allclose(as_numpy_rows(result), as_numpy_rows(expected), atol=1e-5)
    assert batched.captures == 4  # one graph per bucket; the second 4-frame call replayed
    assert len(batched.cached_keys) == 4


def test_graph_launcher_replays_graphs_torch_does_not_make() -> None:
    from vdet.gpu.graphs import graph_launcher

    ran: list[int] = []
    graph = _FakeGraph(lambda: ran.append(1))
    launch = graph_launcher(graph, None)
    launch()
    launch()
    assert graph.replays == 2 and ran == [1, 1]
