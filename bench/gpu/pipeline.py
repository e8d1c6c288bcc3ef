"""GPU pipeline benchmark: a decoded NV12 frame in GPU memory -> detections on the host.

Run on the GPU machine (bench/gpu/run_session_device.sh pipeline does):
    python3 bench/gpu/pipeline.py --out $OUT/gpu_pipeline.json

Per model (the demo YOLOv8n, and a yolov8s.yaml-built ONNX when ultralytics is importable),
FP16, batch 1, 1080p frames letterboxed to 640; sections `graph`/`eager` put the torch reference
ops (vdet.gpu.frame_ops) around the network, `graph_cuda`/`eager_cuda` (and memory, streams,
nvdec) vdet's CUDA kernels, as the service does; `graph_cuda_rect` is `graph_cuda` with the
1080p frames letterboxed into their rectangular input (384x640, `input_shape: rect`; the
network converted at that shape), the square/rect pair measured in the same run (target for
YOLOv8s: p50 <= 1.0 ms at rect); `layer_kernels` is `graph_cuda` at rect and at square with
the network's conv bias + SiLU and max pools through vdet's layer kernels (the default) and
through torch's own (`layer_kernels="off"`), in interleaved rounds; `ultralytics` is
Ultralytics `predict` (FP16) on the same frames as host BGR images, the way a user would call
it:
- latency p50/p99 of `CudaGraphRunner.run` (copy in, preprocess, network, decode + NMS, copy
  out, wait, boxes to source pixels), graph replay against the same work launched eagerly;
- host cost of enqueuing one frame (RunResult.launch_seconds): one replay against every launch;
- GPU memory added per source: allocated and reserved bytes after a runner's first frame;
- K sources, each its own runner, stream and thread, K = 1, 4, 8, 16: aggregate frames/s;
- with PyNvVideoCodec: NVDEC decode of the sample clip alone and decode -> detections per
  source (frames/s), and whether a zero-copy frame's pixels change when the decoder decodes the
  next packets (the reason frames are copied out; see vdet.ingest.nvdec).
JSON out; a short table is printed last.

Each (model, section) runs in a child process of its own (`--section NAME --model PATH`): a CUDA
fault poisons the whole context, and an exception caught in-process would free its frames' CUDA
objects (pinned buffers, events) in destructors that then abort the process (`terminate called
... c10::AcceleratorError`), hiding the Python traceback. So one section's failure is recorded
(traceback, exit code) and the others still run; progress is printed (flushed) and the JSON is
rewritten after every section, so a crash shows where it happened. `--debug` runs the children
with CUDA_LAUNCH_BLOCKING=1 (and C++ stacks), so a fault is reported by the launch that made it.
    python3 bench/gpu/pipeline.py --section nvdec --debug --out nvdec.json   # one, in-process
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
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

from vdet.bench.environment import environment
from vdet.bench.stats import PercentileMethod, percentiles
from vdet.core.contract import rect_input_hw
from vdet.core.types import ColourMatrix, ColourRange
from vdet.gpu.frame_ops import Nv12Geometry
from vdet.gpu.graphs import CudaGraphRunner, RunnerOptions
from vdet.inference.backends.torch import load_onnx_network
from vdet.inference.postprocess import PostprocessParams
from vdet.modelkit.dataset.synthetic import SceneConfig, render_image

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "service" / "vdet" / "assets" / "demo.onnx"
SAMPLE = ROOT / "service" / "vdet" / "assets" / "sample.mp4"
PARAMS = PostprocessParams()
INPUT_HW = (640, 640)
FRAME_WH = (1920, 1080)
# The input a 1080p frame runs at with input_shape: rect (384x640).
RECT_HW = rect_input_hw(FRAME_WH, INPUT_HW, 32)


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


# The sample nearest each rank rather than linear interpolation: these results have always
# been measured values (vdet.bench.stats says how the two differ); the JSON records it.
PERCENTILE_METHOD: PercentileMethod = "nearest"


def _percentiles(values: list[float]) -> dict[str, float]:
    """p50/p90/p99/mean in ms (keys `p50_ms`, ...) of durations in seconds, and the count."""
    found = percentiles(values, (50, 90, 99), PERCENTILE_METHOD)
    return {
        **{f"{key}_ms": value * 1e3 for key, value in found.items()},
        "mean_ms": statistics.fmean(values) * 1e3,
        "n": len(values),
    }


def _kernel_ops() -> dict[str, Any]:
    """vdet's CUDA kernels (NVRTC) as the runner's preprocess and decode + NMS."""
    from vdet.gpu.frame_ops import kernel_ops

    preprocess, decode_nms = kernel_ops(torch.cuda.current_device())
    return {"preprocess": preprocess, "decode_nms": decode_nms}


def _latency(
    network: Any,
    frames: list[torch.Tensor],
    use_graphs: bool,
    iterations: int,
    ops: dict[str, Any] | None = None,
    input_hw: tuple[int, int] = INPUT_HW,
) -> dict[str, Any]:
    options = RunnerOptions(use_graphs=use_graphs, **(ops or {}))
    runner = CudaGraphRunner(network, input_hw=input_hw, options=options)
    geometry = Nv12Geometry.of(FRAME_WH, input_hw, ColourMatrix.BT601, ColourRange.LIMITED)
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
        "input_hw": list(input_hw),
        "ops": "vdet CUDA kernels" if ops else "torch reference ops",
        "replayed": runner.captures > 0 and runner.eager_runs == 0,
        "latency": _percentiles(wall),
        "host_launch": _percentiles(launch),
        "detections_per_frame": detections / iterations,
    }


LAYER_ROUNDS = 6


def _layer_kernels(path: Path, frames: list[torch.Tensor], iterations: int) -> dict[str, Any]:
    """`graph_cuda` with vdet's layer kernels ("auto", what the service runs) and without
    ("off"), at rect and square, in LAYER_ROUNDS rounds alternating which goes first, so that
    clocks and neighbours drifting through the run touch both alike; medians of the rounds."""
    ops = _kernel_ops()
    shapes: dict[str, Any] = {}
    for label, input_hw in (("rect", RECT_HW), ("square", INPUT_HW)):
        networks = {
            variant: load_onnx_network(path, batch=1, input_hw=input_hw, layer_kernels=variant)
            for variant in ("off", "auto")
        }
        p50: dict[str, list[float]] = {"off": [], "auto": []}
        p99: dict[str, list[float]] = {"off": [], "auto": []}
        detections: dict[str, float] = {}
        for round_index in range(LAYER_ROUNDS):
            order = ("off", "auto") if round_index % 2 == 0 else ("auto", "off")
            for variant in order:
                found = _latency(networks[variant], frames, True, iterations, ops, input_hw)
                if not found["replayed"]:
                    raise RuntimeError(f"{variant}: the runner did not replay its graph")
                p50[variant].append(found["latency"]["p50_ms"])
                p99[variant].append(found["latency"]["p99_ms"])
                detections[variant] = found["detections_per_frame"]
        shapes[label] = {
            "input_hw": list(input_hw),
            "p50_ms_median": {v: statistics.median(p50[v]) for v in p50},
            "p99_ms_median": {v: statistics.median(p99[v]) for v in p99},
            "p50_ms_rounds": p50,
            "auto_over_off_p50": statistics.median(p50["auto"]) / statistics.median(p50["off"]),
            "detections_per_frame": detections,
        }
    return {"rounds": LAYER_ROUNDS, "iterations": iterations, "shapes": shapes}


def _memory_per_source(network: Any, frames: list[torch.Tensor]) -> dict[str, float]:
    geometry = Nv12Geometry.of((1920, 1080), INPUT_HW, ColourMatrix.BT601, ColourRange.LIMITED)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    runners = []
    ops = _kernel_ops()
    for _ in range(4):
        runner = CudaGraphRunner(network, input_hw=INPUT_HW, options=RunnerOptions(**ops))
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
    ops = _kernel_ops()
    options = RunnerOptions(**ops)
    runners = [CudaGraphRunner(network, input_hw=INPUT_HW, options=options) for _ in range(sources)]
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

    runner = CudaGraphRunner(network, input_hw=INPUT_HW, options=RunnerOptions(**_kernel_ops()))
    started = time.perf_counter()
    count = 0
    for frame in decode_file(str(SAMPLE)):
        runner.run_frame(frame, PARAMS)
        count += 1
    out["decode_detect_fps"] = count / (time.perf_counter() - started)
    out["decode_detect_replayed"] = runner.eager_runs == 0

    # Does the decoder reuse a returned frame's buffer for later frames? (zero copy)
    # `first` is a view of the decoder's own frame pool: it is read (compared) while the session
    # is alive, and dropped before `close()` frees that pool. (Reading it after close() was a
    # use after free: an illegal memory access that poisoned the context.)
    nvc = load_pynvvideocodec()
    demuxer = nvc.CreateDemuxer(filename=str(SAMPLE))
    decoder = NvdecDecoder("h264", copy_frames=False)
    assert decoder.stream is not None
    first = None
    snapshot = None
    try:
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
        torch.cuda.current_stream().wait_stream(decoder.stream)
        if first is not None and snapshot is not None:
            out["zero_copy_frame_overwritten_by_later_decodes"] = not torch.equal(first, snapshot)
        torch.cuda.synchronize()
    finally:
        first = snapshot = None
        decoder.close()
    return out


def _yolov8s_onnx(folder: Path) -> Path | None:
    try:
        os.environ.setdefault("YOLO_OFFLINE", "1")
        from ultralytics import YOLO  # type: ignore[attr-defined]
    except ImportError:
        return None
    previous = Path.cwd()
    os.chdir(folder)
    try:
        # opset 17: newer Ultralytics default to a Split-18 that onnx2torch cannot convert.
        # dynamic: height and width stay open, so the same file runs square and rect (the
        # conversion folds the shape in either way).
        exported = YOLO("yolov8s.yaml").export(
            format="onnx", imgsz=640, simplify=False, opset=17, dynamic=True
        )
    finally:
        os.chdir(previous)
    return Path(folder, exported).resolve()


def _ultralytics(path: Path, frames: list[torch.Tensor], iterations: int) -> dict[str, Any]:
    """Ultralytics `predict` (FP16, its own letterbox, inference and NMS) on the same 1080p
    frames as host BGR images, the way a user calls it per frame; the peer of `graph_cuda`."""
    os.environ.setdefault("YOLO_OFFLINE", "1")
    from ultralytics import YOLO  # type: ignore[attr-defined]

    yaml_name = "yolov8s.yaml" if "yolov8s" in path.name else None
    if yaml_name is None:
        return {"skipped": "Ultralytics predict needs its own model: measured on yolov8s only"}
    model = YOLO(yaml_name)
    images = []
    for frame in frames:
        nv12 = frame.cpu().numpy()
        images.append(cv2.cvtColor(nv12, cv2.COLOR_YUV2BGR_NV12))
    kwargs: dict[str, Any] = {
        "half": True,
        "device": 0,
        "verbose": False,
        "conf": PARAMS.conf_threshold,
    }
    for image in images[:5]:
        model.predict(image, **kwargs)
    wall = []
    for i in range(iterations):
        started = time.perf_counter()
        model.predict(images[i % len(images)], **kwargs)
        wall.append(time.perf_counter() - started)
    return {"latency": _percentiles(wall), "ultralytics": _version("ultralytics")}


def _version(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"


SECTIONS = (
    "graph",
    "eager",
    "graph_cuda",
    "graph_cuda_rect",
    "layer_kernels",
    "eager_cuda",
    "ultralytics",
    "memory",
    "streams",
    "nvdec",
)
STREAM_SOURCES = (1, 4, 8, 16)


def _progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def _section(name: str, path: Path, iterations: int, seconds: float) -> dict[str, Any]:
    """Run one section on one model, in this process."""
    _progress(f"{path.name} {name}: making 1080p NV12 frames")
    frames = _nv12_frames(8)
    started = time.perf_counter()
    input_hw = RECT_HW if name.endswith("_rect") else INPUT_HW
    network = load_onnx_network(path, batch=1, input_hw=input_hw)
    result: dict[str, Any] = {"load_seconds": time.perf_counter() - started}
    _progress(f"{path.name} {name}: network loaded in {result['load_seconds']:.1f} s")
    if name == "graph":
        result.update(_latency(network, frames, True, iterations))
    elif name == "eager":
        result.update(_latency(network, frames, False, iterations))
    elif name == "graph_cuda":
        result.update(_latency(network, frames, True, iterations, _kernel_ops()))
    elif name == "graph_cuda_rect":
        result.update(_latency(network, frames, True, iterations, _kernel_ops(), RECT_HW))
    elif name == "layer_kernels":
        result.update(_layer_kernels(path, frames, iterations))
    elif name == "eager_cuda":
        result.update(_latency(network, frames, False, iterations, _kernel_ops()))
    elif name == "ultralytics":
        result.update(_ultralytics(path, frames, min(iterations, 200)))
    elif name == "memory":
        result.update(_memory_per_source(network, frames))
    elif name == "streams":
        runs = []
        for k in STREAM_SOURCES:
            runs.append(_streams(network, frames, k, seconds))
            _progress(f"{path.name} streams: {k} sources, {runs[-1]['frames_per_s']:.0f} frames/s")
        result["runs"] = runs
    elif name == "nvdec":
        try:
            import PyNvVideoCodec  # noqa: F401
        except ImportError as exc:
            return {"skipped": str(exc)}
        result.update(_nvdec(network))
    else:
        raise ValueError(f"unknown section {name!r}; one of {SECTIONS}")
    torch.cuda.synchronize()  # a fault of this section is reported here, not later
    return result


def _run_child(args: argparse.Namespace, name: str, path: Path, out: Path) -> dict[str, Any]:
    """`_section` in a child process (see the module docstring); its result or its failure."""
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--section",
        name,
        "--model",
        str(path),
        "--out",
        str(out),
        "--iterations",
        str(args.iterations),
        "--stream-seconds",
        str(args.stream_seconds),
    ]
    if args.debug:
        command.append("--debug")
    started = time.perf_counter()
    try:
        rc = subprocess.run(command, timeout=args.section_timeout, check=False).returncode
    except subprocess.TimeoutExpired:
        rc = None
    wall = time.perf_counter() - started
    result: dict[str, Any] = {}
    if out.exists():
        try:
            result = json.loads(out.read_text())
        except json.JSONDecodeError:
            result = {}
    if rc != 0:
        result.setdefault(
            "error",
            f"timed out after {args.section_timeout} s"
            if rc is None
            else f"exit code {rc} (a negative code is a signal: -6 is abort, as after "
            "'terminate called'); see the log above this section's FAILED line",
        )
    result["section_wall_seconds"] = wall
    return result


def _child_main(args: argparse.Namespace) -> int:
    """--section: run one section in this process and write its JSON to --out."""
    path = args.model or DEMO
    try:
        result = _section(args.section, path, args.iterations, args.stream_seconds)
        rc = 0
    except Exception:
        result = {"error": traceback.format_exc()}
        print(result["error"], file=sys.stderr, flush=True)
        rc = 1
    args.out.write_text(json.dumps(result, indent=1))
    sys.stdout.flush()
    sys.stderr.flush()
    # After a CUDA fault, destructors run at exit (pinned buffers, events) would abort the
    # process and bury the traceback above; the result is written, so leave without them.
    os._exit(rc)


def rect_over_square(model: dict[str, Any]) -> float | None:
    """p50 of `graph_cuda_rect` over `graph_cuda` (same run, same frames), when both ran."""
    square = model.get("graph_cuda", {}).get("latency")
    rect = model.get("graph_cuda_rect", {}).get("latency")
    if not square or not rect:
        return None
    return float(rect["p50_ms"] / square["p50_ms"])


def _print_table(report: dict[str, Any]) -> None:
    print(f"\n{'model':<14}{'mode':<16}{'p50 ms':>9}{'p99 ms':>9}{'launch us':>11}")
    modes = ("graph", "eager", "graph_cuda", "graph_cuda_rect", "eager_cuda", "ultralytics")
    for model in report["models"]:
        for mode in modes:
            if mode not in model:
                continue  # not asked for in this run
            m = model[mode]
            if "skipped" in m:
                continue
            if mode == "ultralytics" and "latency" in m:
                print(f"{model['model']:<14}{'ultra':<16}{m['latency']['p50_ms']:>9.3f}")
                continue
            if "latency" not in m:
                print(f"{model['model']:<14}{mode:<16}error (see JSON)")
                continue
            print(
                f"{model['model']:<14}{mode:<16}{m['latency']['p50_ms']:>9.3f}"
                f"{m['latency']['p99_ms']:>9.3f}{m['host_launch']['p50_ms'] * 1e3:>11.1f}"
            )
        ratio = rect_over_square(model)
        if ratio is not None:
            print(f"  rect / square p50 (graph_cuda): {ratio:.3f}")
        for label, shape in model.get("layer_kernels", {}).get("shapes", {}).items():
            p50 = shape["p50_ms_median"]
            print(
                f"  layer kernels at {label}: p50 {p50['auto']:.3f} ms, torch's layers "
                f"{p50['off']:.3f} ms: {shape['auto_over_off_p50']:.3f}x"
            )
        mem = model.get("memory", {})
        if "allocated_mib_per_source" in mem:
            print(f"  memory per source: {mem['allocated_mib_per_source']:.1f} MiB allocated")
        runs = model.get("streams", {}).get("runs")
        if runs:
            print(
                "  sources -> frames/s: "
                + ", ".join(f"{s['sources']}: {s['frames_per_s']:.0f}" for s in runs)
            )
        nvdec = {k: v for k, v in model.get("nvdec", {}).items() if k != "error"}
        print(f"  nvdec: {json.dumps(nvdec)}")
        failed = [name for name in SECTIONS if "error" in model.get(name, {})]
        if failed:
            print(f"  FAILED sections: {', '.join(failed)} (errors in the JSON)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("gpu_pipeline.json"))
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--stream-seconds", type=float, default=3.0)
    parser.add_argument(
        "--section", choices=SECTIONS, help="run only this section, in this process"
    )
    parser.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated")
    parser.add_argument("--model", type=Path, help="with --section: the ONNX file (demo)")
    parser.add_argument("--no-yolov8s", action="store_true", help="the demo model only")
    parser.add_argument(
        "--yolov8s", type=Path, help="a YOLOv8s ONNX to use instead of exporting one"
    )
    parser.add_argument("--no-demo", action="store_true", help="the yolov8s model only")
    parser.add_argument(
        "--section-timeout", type=float, default=150.0, help="seconds per child process"
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        help="CUDA_LAUNCH_BLOCKING=1 and C++ stacks: a fault is reported by its own launch",
    )
    args = parser.parse_args()
    if args.debug:  # before CUDA is initialised (torch initialises it lazily)
        os.environ["CUDA_LAUNCH_BLOCKING"] = "1"
        os.environ["TORCH_SHOW_CPP_STACKTRACES"] = "1"
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.section is not None:
        return _child_main(args)
    sections = [name for name in args.sections.split(",") if name]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown sections {unknown}; choose from {SECTIONS}")
    report: dict[str, Any] = {
        "environment": environment(),
        "percentile_method": PERCENTILE_METHOD,
        "debug": args.debug,
        "params": {
            "conf": PARAMS.conf_threshold,
            "iou": PARAMS.iou_threshold,
            "top_k": PARAMS.top_k,
        },
        "models": [],
    }
    paths = [] if args.no_demo else [DEMO]
    with tempfile.TemporaryDirectory() as folder:
        if args.no_yolov8s:
            report["yolov8s_error"] = "--no-yolov8s"
        elif args.yolov8s is not None:
            paths.append(args.yolov8s.resolve())
        else:
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
            model: dict[str, Any] = {"model": path.name}
            report["models"].append(model)
            for name in sections:
                _progress(f"{path.name} {name}: start")
                child_out = Path(folder, f"{path.stem}-{name}.json")
                model[name] = _run_child(args, name, path, child_out)
                status = "FAILED" if "error" in model[name] else "done"
                _progress(
                    f"{path.name} {name}: {status} in {model[name]['section_wall_seconds']:.1f} s"
                )
                args.out.write_text(json.dumps(report, indent=1))
    for model in report["models"]:
        ratio = rect_over_square(model)
        if ratio is not None:
            model["rect_over_square_p50"] = round(ratio, 3)
    args.out.write_text(json.dumps(report, indent=1))
    _print_table(report)
    failed = any("error" in m.get(name, {}) for m in report["models"] for name in sections)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
