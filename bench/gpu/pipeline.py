"""GPU pipeline benchmark: a decoded NV12 frame in GPU memory -> detections on the host.

Run on the GPU machine (bench/gpu/run_pipeline_device.sh does):
    python3 bench/gpu/pipeline.py --out $OUT/gpu_pipeline.json

Per model (the demo YOLOv8n, and a yolov8s.yaml-built ONNX when ultralytics is importable),
FP16, batch 1, 1080p frames letterboxed to 640 (torch reference preprocess and decode + NMS,
vdet.pipeline.gpu_ops, inside the graph):
- latency p50/p99 of `CudaGraphRunner.run` (copy in, preprocess, network, decode + NMS, copy
  out, wait, boxes to source pixels), graph replay against the same work launched eagerly;
- host cost of enqueuing one frame (RunResult.launch_seconds): one replay against every launch;
- GPU memory added per source: allocated and reserved bytes after a runner's first frame;
- K sources, each its own runner, stream and thread, K = 1, 4, 8, 16: aggregate frames/s;
- with PyNvVideoCodec: NVDEC decode of the sample clip alone and decode -> detections per
  source (frames/s), and whether a zero-copy frame's pixels change when the decoder decodes the
  next packets (the reason frames are copied out; see vdet.ingest.nvdec).
JSON out; a short table is printed last.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch

from vdet.dataset.synthetic import SceneConfig, render_image
from vdet.pipeline.backends.torch import load_onnx_network
from vdet.pipeline.gpu_ops import Nv12Geometry
from vdet.pipeline.gpu_runner import CudaGraphRunner
from vdet.pipeline.postprocess import PostprocessParams
from vdet.types import ColourMatrix, ColourRange

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "service" / "assets" / "demo.onnx"
SAMPLE = ROOT / "service" / "assets" / "sample.mp4"
PARAMS = PostprocessParams()
INPUT_HW = (640, 640)


def _nv12_frames(count: int, size: tuple[int, int] = (1920, 1080)) -> list[torch.Tensor]:
    frames = []
    for seed in range(count):
        bgr = render_image(seed, SceneConfig(width=size[0], height=size[1])).image_bgr
        h, w = bgr.shape[:2]
        i420 = cv2.cvtColor(bgr, cv2.COLOR_BGR2YUV_I420)
        u = i420[h : h + h // 4].reshape(h // 2, w // 2)
        v = i420[h + h // 4 :].reshape(h // 2, w // 2)
        nv12 = np.concatenate((i420[:h], np.stack((u, v), axis=-1).reshape(h // 2, w)))
        frames.append(torch.from_numpy(np.ascontiguousarray(nv12)).cuda())
    torch.cuda.synchronize()
    return frames


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    return {
        "p50_ms": at(0.5) * 1e3,
        "p90_ms": at(0.9) * 1e3,
        "p99_ms": at(0.99) * 1e3,
        "mean_ms": statistics.fmean(ordered) * 1e3,
        "n": len(ordered),
    }


def _latency(
    network: Any, frames: list[torch.Tensor], use_graphs: bool, iterations: int
) -> dict[str, Any]:
    runner = CudaGraphRunner(network, input_hw=INPUT_HW, use_graphs=use_graphs)
    geometry = Nv12Geometry.of((1920, 1080), INPUT_HW, ColourMatrix.BT601, ColourRange.LIMITED)
    for frame in frames[:5]:
        runner.run(frame, geometry, PARAMS)  # capture and warm up
    wall, launch, detections = [], [], 0
    for i in range(iterations):
        result = runner.run(frames[i % len(frames)], geometry, PARAMS)
        wall.append(result.seconds)
        launch.append(result.launch_seconds)
        detections += len(result.detections)
    return {
        "graph": use_graphs,
        "replayed": runner.captures > 0 and runner.eager_runs == 0,
        "latency": _percentiles(wall),
        "host_launch": _percentiles(launch),
        "detections_per_frame": detections / iterations,
    }


def _memory_per_source(network: Any, frames: list[torch.Tensor]) -> dict[str, float]:
    geometry = Nv12Geometry.of((1920, 1080), INPUT_HW, ColourMatrix.BT601, ColourRange.LIMITED)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    runners = []
    for _ in range(4):
        runner = CudaGraphRunner(network, input_hw=INPUT_HW)
        runner.run(frames[0], geometry, PARAMS)
        runners.append(runner)
    torch.cuda.synchronize()
    after = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    for runner in runners:
        runner.close()
    return {
        "allocated_mib_per_source": (after[0] - before[0]) / len(runners) / 2**20,
        "reserved_mib_per_source": (after[1] - before[1]) / len(runners) / 2**20,
    }


def _streams(
    network: Any, frames: list[torch.Tensor], sources: int, seconds: float
) -> dict[str, Any]:
    geometry = Nv12Geometry.of((1920, 1080), INPUT_HW, ColourMatrix.BT601, ColourRange.LIMITED)
    runners = [CudaGraphRunner(network, input_hw=INPUT_HW) for _ in range(sources)]
    for runner in runners:
        runner.run(frames[0], geometry, PARAMS)
    counts = [0] * sources
    start = threading.Barrier(sources + 1)
    deadline = [0.0]

    def loop(index: int) -> None:
        runner = runners[index]
        start.wait()
        i = index
        while time.perf_counter() < deadline[0]:
            runner.run(frames[i % len(frames)], geometry, PARAMS)
            counts[index] += 1
            i += 1

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(sources)]
    for thread in threads:
        thread.start()
    deadline[0] = time.perf_counter() + seconds
    begun = time.perf_counter()
    start.wait()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - begun
    return {
        "sources": sources,
        "frames": sum(counts),
        "seconds": elapsed,
        "frames_per_s": sum(counts) / elapsed,
        "eager_runs": sum(r.eager_runs for r in runners),
    }


def _nvdec(network: Any) -> dict[str, Any]:
    from vdet.ingest.nvdec import NvdecDecoder, decode_file, load_pynvvideocodec, packet_bytes

    out: dict[str, Any] = {}
    started = time.perf_counter()
    frames = sum(1 for _ in decode_file(str(SAMPLE)))
    torch.cuda.synchronize()
    out["decode_only_fps"] = frames / (time.perf_counter() - started)
    out["decode_only_frames"] = frames

    runner = CudaGraphRunner(network, input_hw=INPUT_HW)
    started = time.perf_counter()
    count = 0
    for frame in decode_file(str(SAMPLE)):
        runner.run_frame(frame, PARAMS)
        count += 1
    out["decode_detect_fps"] = count / (time.perf_counter() - started)
    out["decode_detect_replayed"] = runner.eager_runs == 0

    # Does the decoder reuse a returned frame's buffer for later frames? (zero copy)
    nvc = load_pynvvideocodec()
    demuxer = nvc.CreateDemuxer(filename=str(SAMPLE))
    decoder = NvdecDecoder("h264", copy_frames=False)
    first = None
    snapshot = None
    for i, packet in enumerate(demuxer):
        data = packet_bytes(packet)
        if not data:
            continue
        decoded = decoder.decode(data, int(packet.pts), bool(packet.key))
        if first is None and decoded:
            first = decoded[0].nv12
            torch.cuda.current_stream().wait_stream(decoder.stream)
            snapshot = first.clone()
        if i >= 10:
            break
    decoder.close()
    torch.cuda.synchronize()
    if first is not None and snapshot is not None:
        out["zero_copy_frame_overwritten_by_later_decodes"] = not torch.equal(first, snapshot)
    return out


def _yolov8s_onnx(folder: Path) -> Path | None:
    try:
        os.environ.setdefault("YOLO_OFFLINE", "1")
        from ultralytics import YOLO
    except ImportError:
        return None
    previous = Path.cwd()
    os.chdir(folder)
    try:
        exported = YOLO("yolov8s.yaml").export(format="onnx", imgsz=640, simplify=False)
    finally:
        os.chdir(previous)
    return Path(folder, exported).resolve()


def _model(
    path: Path, frames: list[torch.Tensor], iterations: int, seconds: float
) -> dict[str, Any]:
    result: dict[str, Any] = {"model": path.name}
    started = time.perf_counter()
    network = load_onnx_network(path, batch=1, input_hw=INPUT_HW)
    result["load_seconds"] = time.perf_counter() - started
    result["graph"] = _latency(network, frames, True, iterations)
    result["eager"] = _latency(network, frames, False, iterations)
    result["memory"] = _memory_per_source(network, frames)
    result["streams"] = [_streams(network, frames, k, seconds) for k in (1, 4, 8, 16)]
    try:
        import PyNvVideoCodec  # noqa: F401

        result["nvdec"] = _nvdec(network)
    except ImportError as exc:
        result["nvdec"] = {"skipped": str(exc)}
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("gpu_pipeline.json"))
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--stream-seconds", type=float, default=3.0)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    report: dict[str, Any] = {
        "host": platform.node(),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "params": {
            "conf": PARAMS.conf_threshold,
            "iou": PARAMS.iou_threshold,
            "top_k": PARAMS.top_k,
        },
        "models": [],
    }
    frames = _nv12_frames(8)
    paths = [DEMO]
    with tempfile.TemporaryDirectory() as folder:
        try:
            extra = _yolov8s_onnx(Path(folder))
        except Exception:
            extra = None
            report["yolov8s_error"] = traceback.format_exc()
        if extra is not None:
            paths.append(extra)
        else:
            report.setdefault("yolov8s_error", "ultralytics is not importable here")
        for path in paths:
            try:
                report["models"].append(_model(path, frames, args.iterations, args.stream_seconds))
            except Exception:
                report["models"].append({"model": path.name, "error": traceback.format_exc()})
            args.out.write_text(json.dumps(report, indent=1))
    args.out.write_text(json.dumps(report, indent=1))

    print(f"\n{'model':<14}{'mode':<7}{'p50 ms':>9}{'p99 ms':>9}{'launch us':>11}")
    for model in report["models"]:
        if "error" in model:
            print(f"{model['model']:<14}error (see JSON)")
            continue
        for mode in ("graph", "eager"):
            m = model[mode]
            print(
                f"{model['model']:<14}{mode:<7}{m['latency']['p50_ms']:>9.3f}"
                f"{m['latency']['p99_ms']:>9.3f}{m['host_launch']['p50_ms'] * 1e3:>11.1f}"
            )
        mem = model["memory"]
        print(f"  memory per source: {mem['allocated_mib_per_source']:.1f} MiB allocated")
        print(
            "  sources -> frames/s: "
            + ", ".join(f"{s['sources']}: {s['frames_per_s']:.0f}" for s in model["streams"])
        )
        print(f"  nvdec: {json.dumps(model['nvdec'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
