"""Micro-benchmarks of the vdet CUDA kernels against CPU OpenCV and GPU torch baselines.

Run on the GPU machine (bench/gpu/run_session_device.sh pipeline does):
python3 bench/gpu/kernels.py --out X.json

Timing. GPU: CUDA events on the stream, warm-up first, median (p10, p90) of many iterations.
"eager" times one call from Python with events around it (what a Python caller pays, launch
overhead included, GPU idle while Python enqueues); "graph" captures `reps` calls in one CUDA
graph and times replays divided by `reps` (device time: what a graph-replaying pipeline pays).
Inputs rotate over several buffers so that not every iteration hits the L2 cache. CPU: the
median of time.perf_counter over repeated calls.

Baselines. Preprocess: OpenCV on the CPU (cvtColor NV12 -> RGB, resize INTER_LINEAR,
copyMakeBorder 114, HWC -> CHW float / 255), the project's CPU `letterbox` on a BGR frame, and
the same NV12 letterbox written in torch ops on the GPU. Decode + NMS: Ultralytics'
non_max_suppression logic in torch + torchvision.ops.nms (conf filter, best class, sort, top
max_nms, class offset of 7680 px, NMS, max_det), per image, on the GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch
import torchvision
from torch.nn import functional

from vdet.bench.environment import environment
from vdet.bench.stats import PercentileMethod, percentiles
from vdet.core.contract import compute_letterbox
from vdet.cuda import launch
from vdet.cuda.ops import GpuOps, decode_nms_workspace_bytes, yuv_coefficients
from vdet.inference.postprocess import PostprocessParams
from vdet.inference.preprocess import letterbox

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "service" / "vdet" / "assets" / "sample.mp4"


# Linear interpolation (vdet.bench.stats), recorded in the JSON. Result files without the key
# (2026-12-02) took p10/p90 as the sample at index n // 10 and 9n // 10 of the sorted list; the
# medians are the same either way.
PERCENTILE_METHOD: PercentileMethod = "linear"


def stats(samples_ms: list[float]) -> dict[str, float]:
    """median/p10/p90 in microseconds of times in milliseconds, and the count."""
    found = percentiles(samples_ms, (50, 10, 90), PERCENTILE_METHOD)
    return {
        "median_us": round(1000 * found["p50"], 2),
        "p10_us": round(1000 * found["p10"], 2),
        "p90_us": round(1000 * found["p90"], 2),
        "iterations": len(samples_ms),
    }


def eager_gpu(
    fn: Callable[[torch.cuda.Stream], None],
    stream: torch.cuda.Stream,
    iters: int = 200,
    warmup: int = 20,
) -> dict[str, float]:
    for _ in range(warmup):
        fn(stream)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    samples = []
    for _ in range(iters):
        start.record(stream)
        fn(stream)
        end.record(stream)
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return stats(samples)


def graph_gpu(
    fn: Callable[[torch.cuda.Stream], None],
    reps: int = 20,
    replays: int = 50,
    per_call_items: int = 1,
) -> dict[str, float]:
    """Device time per call (and per item, e.g. per image of a batch) from graph replays."""
    side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn(side)
    side.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        capture = torch.cuda.current_stream()
        for _ in range(reps):
            fn(capture)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    samples = []
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / reps)
    result = stats(samples)
    if per_call_items > 1:
        result["per_item_median_us"] = round(result["median_us"] / per_call_items, 2)
    return result


def on_stream(fn: Callable[[], object]) -> Callable[[torch.cuda.Stream], None]:
    """Run torch code on the stream the timing events are recorded on."""

    def run(stream: torch.cuda.Stream) -> None:
        with torch.cuda.stream(stream):
            fn()

    return run


def cpu_time(fn: Callable[[], object], iters: int = 30, warmup: int = 3) -> dict[str, float]:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        samples.append(1000 * (time.perf_counter() - t0))
    return stats(samples)


def kernel_breakdown(
    fn: Callable[[torch.cuda.Stream], None], stream: torch.cuda.Stream, calls: int = 50
) -> dict[str, float]:
    """Average device time per kernel (us) from the torch profiler (CUPTI sees every kernel)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn(stream)
        torch.cuda.synchronize()
    out: dict[str, float] = {}
    for event in prof.key_averages():
        if not (event.key.startswith("vdet_") or "emset" in event.key):
            continue
        total = None
        for name in ("device_time_total", "cuda_time_total", "self_device_time_total"):
            total = getattr(event, name, None)
            if total:
                break
        if total:
            out[event.key] = round(float(total) / max(event.count, 1), 2)
    return out


# ---- inputs -----------------------------------------------------------------------------------


def sample_nv12(count: int) -> list[np.ndarray]:
    """NV12 surfaces of the sample clip (PyAV), or random ones without PyAV."""
    try:
        import av

        frames = []
        with av.open(str(SAMPLE)) as container:
            for frame in container.decode(container.streams.video[0]):
                frames.append(frame.to_ndarray(format="nv12"))
                if len(frames) == count:
                    break
        return frames
    except Exception:
        rng = np.random.default_rng(0)
        return [rng.integers(0, 256, (1620, 1920), np.uint8) for _ in range(count)]


def dense_heads(
    rng: np.random.Generator, batch: int, nc: int = 80, n: int = 8400, dense: bool = True
) -> np.ndarray:
    head = np.empty((batch, 4 + nc, n), np.float32)
    head[:, 0:2] = rng.uniform(0, 640, (batch, 2, n))
    head[:, 2:4] = rng.uniform(4, 160, (batch, 2, n))
    if dense:  # every anchor passes conf 0.25: the worst case
        head[:, 4:] = rng.uniform(0.3, 0.9, (batch, nc, n))
    else:  # like a trained model on a busy frame: about 1% of anchors pass
        head[:, 4:] = rng.uniform(0.0, 0.2, (batch, nc, n))
        for b in range(batch):
            hits = rng.choice(n, n // 100, replace=False)
            head[b, 4 + rng.integers(0, nc, hits.size), hits] = rng.uniform(0.3, 0.95, hits.size)
    return head


# ---- baselines --------------------------------------------------------------------------------


def torch_nv12_letterbox(nv12: torch.Tensor, out: torch.Tensor, k: Any, geometry: Any) -> None:
    """The kernel's NV12 letterbox in torch ops (same rounding steps), fp16 out."""
    h, w = nv12.shape[0] * 2 // 3, nv12.shape[1]
    luma = (nv12[:h].float() - float(k.y_offset)) * float(k.y_scale)
    uv = nv12[h:].view(h // 2, w // 2, 2).float() - 128.0
    uv = uv.repeat_interleave(2, dim=0).repeat_interleave(2, dim=1)
    u, v = uv[..., 0], uv[..., 1]
    rgb = (
        torch.stack(
            (
                luma + float(k.r_v) * v,
                (luma - float(k.g_u) * u) - float(k.g_v) * v,
                luma + float(k.b_u) * u,
            )
        )
        .round_()
        .clamp_(0, 255)
    )
    new_w, new_h = geometry.resized_wh
    resized = functional.interpolate(
        rgb[None], size=(new_h, new_w), mode="bilinear", align_corners=False
    )
    resized = torch.floor(resized + 0.5).clamp_(0, 255)
    out.fill_(114.0 / 255.0)
    top, left = geometry.pad_y, geometry.pad_x
    out[:, :, top : top + new_h, left : left + new_w] = resized / 255.0


def opencv_letterbox(nv12: np.ndarray, geometry: Any) -> np.ndarray:
    rgb = cv2.cvtColor(nv12, cv2.COLOR_YUV2RGB_NV12)
    new_w, new_h = geometry.resized_wh
    resized = cv2.resize(rgb, (new_w, new_h), interpolation=cv2.INTER_LINEAR)
    H, W = geometry.input_hw
    top, left = geometry.pad_y, geometry.pad_x
    padded = cv2.copyMakeBorder(
        resized,
        top,
        H - new_h - top,
        left,
        W - new_w - left,
        cv2.BORDER_CONSTANT,
        value=(114, 114, 114),
    )
    return np.ascontiguousarray(padded.transpose(2, 0, 1)).astype(np.float32) / np.float32(255)


def ultralytics_style_nms(
    pred: torch.Tensor,
    conf: float = 0.25,
    iou: float = 0.45,
    max_det: int = 300,
    max_nms: int = 30000,
) -> list[torch.Tensor]:
    """Ultralytics' non_max_suppression (single label, class-aware) on a raw head."""
    max_wh = 7680
    xc = pred[:, 4:].amax(1) > conf
    pred = pred.transpose(-1, -2)
    output = []
    for xi in range(pred.shape[0]):
        x = pred[xi][xc[xi]]
        box = x[:, :4]
        xy, wh = box[:, :2], box[:, 2:] / 2
        box = torch.cat((xy - wh, xy + wh), 1)
        confs, j = x[:, 4:].max(1, keepdim=True)
        x = torch.cat((box, confs, j.float()), 1)[confs.view(-1) > conf]
        if x.shape[0] > max_nms:
            x = x[x[:, 4].argsort(descending=True)[:max_nms]]
        c = x[:, 5:6] * max_wh
        keep = torchvision.ops.nms(x[:, :4] + c, x[:, 4], iou)[:max_det]
        output.append(x[keep])
    return output


# ---- sections ---------------------------------------------------------------------------------


def kernel_environment(ops: GpuOps) -> dict[str, Any]:
    """The machine (vdet.bench.pipeline.environment) and what the kernels were built for and run
    on."""
    backend: Any = ops.backend
    return {
        **environment(),
        "gpu": torch.cuda.get_device_name(0),
        "compute_capability": list(backend.compute_capability),
        "sm_count": torch.cuda.get_device_properties(0).multi_processor_count,
        "torch": torch.__version__,
        "nvrtc": ".".join(map(str, launch.nvrtc_version())),
        "kernel_arch": backend.arch,
    }


def bench_preprocess(ops: GpuOps) -> dict[str, Any]:
    results: dict[str, Any] = {}
    surfaces_np = sample_nv12(8)
    surfaces = [torch.from_numpy(s).cuda() for s in surfaces_np]
    h, w = 1080, 1920
    geometry = compute_letterbox((w, h), (640, 640))
    k = yuv_coefficients("bt709", False)
    out16 = torch.empty((8, 3, 640, 640), dtype=torch.float16, device="cuda")
    out32 = torch.empty((8, 3, 640, 640), dtype=torch.float32, device="cuda")
    bgr_np = [cv2.cvtColor(s, cv2.COLOR_YUV2BGR_NV12).astype(np.uint8) for s in surfaces_np]
    bgr = [torch.from_numpy(b).cuda() for b in bgr_np]
    torch.cuda.synchronize()
    turn = [0]

    def nv12_one(out: torch.Tensor) -> Callable[[torch.cuda.Stream], None]:
        def run(stream: torch.cuda.Stream) -> None:
            s = surfaces[turn[0] % 8]
            turn[0] += 1
            ops.letterbox_nv12([s[:h]], [s[h:]], out[:1], matrix="bt709", stream=stream)

        return run

    def nv12_batch(stream: torch.cuda.Stream) -> None:
        ops.letterbox_nv12(
            [s[:h] for s in surfaces],
            [s[h:] for s in surfaces],
            out16,
            matrix="bt709",
            stream=stream,
        )

    def bgr_one(stream: torch.cuda.Stream) -> None:
        ops.letterbox_bgr([bgr[turn[0] % 8]], out16[:1], stream=stream)
        turn[0] += 1

    def torch_one(stream: torch.cuda.Stream) -> None:
        with torch.cuda.stream(stream):
            torch_nv12_letterbox(surfaces[turn[0] % 8], out16[:1], k, geometry)
        turn[0] += 1

    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    sections: list[tuple[str, Callable[[], Any]]] = [
        ("vdet_nv12_fp16_b1_graph", lambda: graph_gpu(nv12_one(out16))),
        ("vdet_nv12_fp16_b1_eager", lambda: eager_gpu(nv12_one(out16), stream)),
        ("vdet_nv12_fp32_b1_graph", lambda: graph_gpu(nv12_one(out32))),
        ("vdet_nv12_fp16_b8_graph", lambda: graph_gpu(nv12_batch, reps=10, per_call_items=8)),
        ("vdet_bgr_fp16_b1_graph", lambda: graph_gpu(bgr_one)),
        ("torch_ops_nv12_fp16_b1_graph", lambda: graph_gpu(torch_one)),
        ("torch_ops_nv12_fp16_b1_eager", lambda: eager_gpu(torch_one, stream, iters=100)),
        ("cpu_opencv_nv12", lambda: cpu_time(lambda: opencv_letterbox(surfaces_np[0], geometry))),
        ("cpu_vdet_letterbox_bgr", lambda: cpu_time(lambda: letterbox(bgr_np[0], (640, 640)))),
        ("kernel_breakdown_nv12_b1", lambda: kernel_breakdown(nv12_one(out16), stream)),
    ]
    for name, run in sections:
        try:
            results[name] = run()
        except Exception:
            results[name] = {"error": traceback.format_exc(limit=3)}
    bytes_moved = 1620 * 1920 + 3 * 640 * 640 * 2
    graph = results.get("vdet_nv12_fp16_b1_graph", {})
    if "median_us" in graph:
        results["vdet_nv12_fp16_b1_effective_GBps"] = round(
            bytes_moved / graph["median_us"] / 1e3, 1
        )
    return results


def bench_decode_nms(ops: GpuOps) -> dict[str, Any]:
    results: dict[str, Any] = {}
    rng = np.random.default_rng(0)
    params = PostprocessParams()  # the serving defaults of vdet.core.contract
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]

    def ours(batch: int, dense: bool = True) -> tuple[Callable[[torch.cuda.Stream], None], Any]:
        heads = [torch.from_numpy(dense_heads(rng, batch, dense=dense)).cuda() for _ in range(4)]
        out = torch.empty((batch, params.max_det, 6), dtype=torch.float32, device="cuda")
        count = torch.empty((batch,), dtype=torch.int32, device="cuda")
        nbytes = decode_nms_workspace_bytes(batch, 8400, params.top_k)
        ws = torch.empty((nbytes,), dtype=torch.uint8, device="cuda")
        turn = [0]

        def run(s: torch.cuda.Stream) -> None:
            ops.decode_nms(heads[turn[0] % 4], out, count, params, workspace=ws, stream=s)
            turn[0] += 1

        return run, count

    dense1, count1 = ours(1)
    sections: list[tuple[str, Callable[[], Any]]] = [
        ("vdet_dense_8400x80_b1_graph", lambda: graph_gpu(dense1)),
        ("vdet_dense_8400x80_b1_eager", lambda: eager_gpu(dense1, stream)),
        ("vdet_dense_8400x80_b8_graph", lambda: graph_gpu(ours(8)[0], reps=10, per_call_items=8)),
        (
            "vdet_dense_8400x80_b32_graph",
            lambda: graph_gpu(ours(32)[0], reps=5, replays=20, per_call_items=32),
        ),
        ("vdet_sparse_8400x80_b1_graph", lambda: graph_gpu(ours(1, dense=False)[0])),
        ("kernel_breakdown_dense_b1", lambda: kernel_breakdown(dense1, stream)),
    ]
    for name, run in sections:
        try:
            results[name] = run()
        except Exception:
            results[name] = {"error": traceback.format_exc(limit=3)}
    torch.cuda.synchronize()
    results["vdet_dense_b1_kept"] = int(count1.cpu()[0])

    dense = torch.from_numpy(dense_heads(rng, 1)).cuda()
    sparse = torch.from_numpy(dense_heads(rng, 1, dense=False)).cuda()
    baselines: list[tuple[str, Callable[[], Any]]] = [
        (
            "torchvision_ultralytics_style_dense_b1",
            lambda: eager_gpu(
                on_stream(lambda: ultralytics_style_nms(dense)), stream, iters=30, warmup=3
            ),
        ),
        (
            "torchvision_ultralytics_style_dense_b1_top1000",
            lambda: eager_gpu(
                on_stream(lambda: ultralytics_style_nms(dense, max_nms=1000)),
                stream,
                iters=30,
                warmup=3,
            ),
        ),
        (
            "torchvision_ultralytics_style_sparse_b1",
            lambda: eager_gpu(
                on_stream(lambda: ultralytics_style_nms(sparse)), stream, iters=50, warmup=5
            ),
        ),
    ]
    for name, run in baselines:
        try:
            results[name] = run()
        except Exception:
            results[name] = {"error": traceback.format_exc(limit=3)}
    try:
        results["torchvision_dense_b1_kept"] = len(ultralytics_style_nms(dense)[0])
    except Exception:
        results["torchvision_dense_b1_kept"] = None
    return results


def table(report: dict[str, Any]) -> str:
    lines = [f"{'benchmark':<52} {'median us':>10} {'per item':>9}"]
    for section in ("preprocess", "decode_nms"):
        for name, value in report[section].items():
            if isinstance(value, dict) and "median_us" in value:
                per = value.get("per_item_median_us", "")
                lines.append(f"{section + '/' + name:<52} {value['median_us']:>10} {per:>9}")
            elif isinstance(value, dict) and "error" in value:
                lines.append(f"{section + '/' + name:<52} {'ERROR':>10}")
    for section in ("preprocess", "decode_nms"):
        for name, value in report[section].items():
            if name.startswith("kernel_breakdown") and isinstance(value, dict):
                parts = ", ".join(f"{k}={v}" for k, v in value.items())
                lines.append(f"{name}: {parts} (us)")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    ops = GpuOps()
    torch.cuda.init()  # type: ignore[no-untyped-call]
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "what": "vdet CUDA kernels vs OpenCV CPU and torch/torchvision GPU baselines",
        "environment": kernel_environment(ops),
        "percentile_method": PERCENTILE_METHOD,
        "params": {"input": "1080p NV12/BGR -> 640x640", "nms": vars(PostprocessParams())},
    }
    report["params"]["nms"]["classes"] = None
    report["preprocess"] = bench_preprocess(ops)
    report["decode_nms"] = bench_decode_nms(ops)
    backend: Any = ops.backend
    report["environment"]["nvrtc_log"] = {m: c.log for m, c in backend.compiled.items()}
    args.out.write_text(json.dumps(report, indent=2, default=str))
    print(table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
