"""Where does the GPU path lose recall on the sample clip? FP32 against FP16, frame by frame.

Run on the GPU machine: python3 bench/gpu/accuracy.py --out accuracy.json

Every frame of the sample clip decoded by NVDEC goes through a `CudaGraphRunner` with vdet's
kernels and the demo network converted to torch, once in FP32 and once in FP16 (the service's
default); the same clip decoded by FFmpeg on the CPU goes through the ONNX Runtime CPU path.
Each is scored against the clip's exact truth (class-aware recall at IoU 0.5, as the GPU tests
do) at several confidence thresholds, and with the truth shifted by -1..+1 frames (to rule out a
frame-numbering offset). The raw heads of FP32 and FP16 are compared on the same input, and the
largest activations of the FP32 network are listed (FP16 overflows past 65504).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vdet.bench.environment import environment
from vdet.core.types import Detections
from vdet.gpu.frame_ops import Nv12Geometry, kernel_ops
from vdet.gpu.graphs import CudaGraphRunner, RunnerOptions
from vdet.inference.backends.torch import TorchBackend
from vdet.inference.postprocess import PostprocessParams
from vdet.ingest.nvdec import decode_file
from vdet.modelkit.dataset import clip_truth as truth

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "service" / "vdet" / "assets" / "demo.onnx"
SAMPLE = ROOT / "service" / "vdet" / "assets" / "sample.mp4"
THRESHOLDS = (0.1, 0.25, 0.4, 0.5)
LOW = PostprocessParams(conf_threshold=min(THRESHOLDS))


def _scores(per_frame: list[Detections]) -> dict[str, Any]:
    """Recall per threshold (aligned), and at 0.25 with the truth shifted by -1..+1 frames."""
    out: dict[str, Any] = {}
    for t in THRESHOLDS:
        pairs = [(i, truth.as_dicts(d, t)) for i, d in enumerate(per_frame)]
        out[f"recall@{t}"] = truth.recall(pairs)
    for shift in (-1, 1):
        pairs = [
            (i + shift, truth.as_dicts(d, 0.25)) for i, d in enumerate(per_frame) if i + shift >= 0
        ]
        out[f"recall@0.25_shift{shift:+d}"] = truth.recall(pairs)
    out["detections_per_frame@0.25"] = float(
        np.mean([int((d.scores >= 0.25).sum()) for d in per_frame])
    )
    return out


def demo_runner(
    fp16: bool = True, blocking_wait: bool = False
) -> tuple[CudaGraphRunner, TorchBackend]:
    """The demo network in a `CudaGraphRunner` with vdet's kernels on GPU 0, as a stream's
    (`blocking_wait` as the service sets it: GpuTuning.host_wait "block")."""
    backend = TorchBackend(DEMO, fp16=fp16, cuda_graph=False)
    preprocess, decode_nms = kernel_ops(0)
    runner = CudaGraphRunner(
        backend.network_for_batch(1),
        input_hw=backend.info.input_hw,
        options=RunnerOptions(
            dtype=backend.dtype,
            preprocess=preprocess,
            decode_nms=decode_nms,
            channels_last=backend.channels_last,
            blocking_wait=blocking_wait,
        ),
    )
    return runner, backend


def _gpu_run(frames: list[Any], fp16: bool) -> tuple[list[Detections], Any]:
    runner, backend = demo_runner(fp16)
    results = [runner.run_frame(f, LOW).detections for f in frames]
    return results, backend


def _head_comparison(frames: list[Any], fp32: Any, fp16: Any) -> dict[str, Any]:
    """Raw heads of both networks on the same letterboxed frames, and FP32's largest activations."""
    preprocess, _ = kernel_ops(0)
    h, w = fp32.info.input_hw
    net32, net16 = fp32.network_for_batch(1), fp16.network_for_batch(1)
    peaks: dict[str, float] = {}

    def hook(name: str) -> Any:
        def record(_module: Any, _inputs: Any, output: Any) -> None:
            if isinstance(output, torch.Tensor) and output.is_floating_point():
                peaks[name] = max(peaks.get(name, 0.0), float(output.abs().max()))

        return record

    handles = [
        m.register_forward_hook(hook(n)) for n, m in net32.named_modules() if not list(m.children())
    ]
    box_diff, score_diff, flips, nonfinite = [], [], 0, 0
    stream = torch.cuda.current_stream()
    with torch.no_grad():
        for frame in frames[::30]:
            frame.ready.synchronize()
            x = torch.zeros((1, 3, h, w), dtype=torch.float32, device="cuda")
            geometry = Nv12Geometry.of(frame.size_wh, (h, w), frame.matrix, frame.colour_range)
            preprocess(frame.nv12, geometry, x[0], stream)
            a = net32(x.contiguous(memory_format=torch.channels_last)).float()
            b = net16(x.half().contiguous(memory_format=torch.channels_last)).float()
            nonfinite += int((~torch.isfinite(b)).sum())
            box_diff.append(float((a[:, :4] - b[:, :4]).abs().max()))
            score_diff.append(float((a[:, 4:] - b[:, 4:]).abs().max()))
            flips += int(((a[:, 4:] >= 0.25) != (b[:, 4:] >= 0.25)).sum())
    for handle in handles:
        handle.remove()
    ranked = sorted(peaks.items(), key=lambda kv: -kv[1])[:10]
    return {
        "frames_compared": len(box_diff),
        "box_max_abs_diff_px": max(box_diff),
        "score_max_abs_diff": max(score_diff),
        "anchor_class_pairs_crossing_0.25": flips,
        "fp16_nonfinite_values": nonfinite,
        "fp32_largest_activations": ranked,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("accuracy.json"))
    args = parser.parse_args()
    started = time.perf_counter()
    # FP32 means FP32 here, as on the CPU: no TF32 convolutions (torch allows them by default).
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    frames = list(decode_file(str(SAMPLE)))
    report: dict[str, Any] = {
        "clip": SAMPLE.name,
        "frames": len(frames),
        "environment": environment(),
    }
    gpu32, backend32 = _gpu_run(frames, fp16=False)
    gpu16, backend16 = _gpu_run(frames, fp16=True)
    report["gpu_fp32"] = _scores(gpu32)
    report["gpu_fp16"] = _scores(gpu16)
    report["heads"] = _head_comparison(frames, backend32, backend16)
    print(json.dumps(report, indent=1), flush=True)
    by_index = truth.cpu_path_detections(LOW)
    cpu = [by_index[i] for i in sorted(by_index)]
    report["cpu_onnxruntime_fp32"] = _scores(cpu)
    report["cpu_frames"] = len(cpu)
    report["seconds"] = round(time.perf_counter() - started, 1)
    args.out.write_text(json.dumps(report, indent=1))
    for name in ("gpu_fp32", "gpu_fp16", "cpu_onnxruntime_fp32"):
        r = report[name]
        print(
            f"{name:<22} recall@0.25 {r['recall@0.25']:.3f} "
            f"(shift -1 {r['recall@0.25_shift-1']:.3f}, +1 {r['recall@0.25_shift+1']:.3f}) "
            f"@0.1 {r['recall@0.1']:.3f} "
            f"@0.4 {r['recall@0.4']:.3f} dets/frame {r['detections_per_frame@0.25']:.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
