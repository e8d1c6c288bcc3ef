"""`vdet bench`: measured figures with the machine they were measured on.

A figure is only worth committing with its context (date, CPU/GPU, versions) and beside a
baseline measured in the same run. This module owns the measuring loops and the environment
record (`environment()`, which every benchmark, bench/ and bench/gpu/ included, writes into its
result file); the stages measured are the service's own (`Detector`, `SourceReader`), called
exactly as the service calls them. Percentiles come from `vdet.bench.stats`.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import shutil
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import numpy as np

from vdet.bench.stats import percentiles
from vdet.inference.detector import Detector, InputShape
from vdet.ingest.reader import DecodeError, SourceReader

# Recorded where installed: the GPU scripts' stack too (NVDEC, onnx2torch, the CUDA bindings,
# and the Ultralytics peer they measure against).
_PACKAGES = (
    "vdet",
    "numpy",
    "onnxruntime",
    "opencv-python-headless",
    "av",
    "torch",
    "torchvision",
    "onnx2torch",
    "pynvvideocodec",
    "cuda-bindings",
    "ultralytics",
)
_NVIDIA_SMI_TIMEOUT_S = 20.0


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what `platform` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpus() -> dict[str, str]:
    """The machine's NVIDIA GPUs as nvidia-smi lists them: "gpu" (the first one's name) and
    "driver" (per GPU: driver version, max SM clock, memory); {} without a working nvidia-smi.

    nvidia-smi rather than CUDA: asking creates no CUDA context in the measuring process, and
    CPU benchmarks need not import torch.
    """
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {}
    try:
        done = subprocess.run(
            [
                exe,
                "--query-gpu=name,driver_version,clocks.max.sm,memory.total",
                "--format=csv,noheader",
            ],
            capture_output=True,
            text=True,
            timeout=_NVIDIA_SMI_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return {}
    rows = [line.split(", ", 1) for line in done.stdout.strip().splitlines()]
    rows = [row for row in rows if len(row) == 2]
    if done.returncode != 0 or not rows:
        return {}
    return {"gpu": rows[0][0], "driver": "\n".join(rest for _, rest in rows)}


def environment() -> dict[str, object]:
    """Where and with what a benchmark ran: date, CPU, load, Python, the GPUs (when nvidia-smi
    lists any) and the versions of the packages that make the figures."""
    versions = {}
    for name in _PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    cpu = cpu_model()
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host_cpu": cpu,
        "cpu_count": os.cpu_count(),
        # Other work on a shared machine moves absolute times: record how busy it was.
        "load_average_1m": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
        "platform": platform.platform(),
        **gpus(),
        "packages": versions,
    }


def summarize_ms(seconds: list[float]) -> dict[str, float]:
    """p50/p95/p99/mean in milliseconds of a list of durations in seconds, and the count."""
    if not seconds:
        return {}
    a = np.asarray(seconds) * 1e3
    found = percentiles(a, (50, 95, 99))
    return {
        **{key: round(value, 3) for key, value in found.items()},
        "mean": round(float(a.mean()), 3),
        "n": len(seconds),
    }


def run_pipeline_bench(
    model: str | os.PathLike[str],
    backend: str,
    source: str,
    frames: int = 150,
    warmup: int = 10,
    input_shape: InputShape = "rect",
) -> dict[str, object]:
    """Per-stage latency of decode -> preprocess -> infer -> postprocess on one clip.

    Frames are decoded as fast as possible (no real-time pacing) and each is detected right
    away, batch 1, the way one live source runs through the service.
    """
    stages: dict[str, list[float]] = {
        k: [] for k in ("decode", "preprocess", "inference", "postprocess", "total")
    }
    with (
        Detector.open(model, backend, input_shape=input_shape) as detector,
        SourceReader(source, loop=True) as reader,
    ):
        info = reader.open()
        used_hw = detector.input_hw((info.width, info.height))
        done = 0
        for item in reader.frames():
            if isinstance(item, DecodeError):
                continue
            start = time.perf_counter()
            ((_, timings),) = detector.detect([item.image_bgr])
            elapsed = time.perf_counter() - start
            done += 1
            if done <= warmup:
                continue
            stages["decode"].append(item.decode_seconds)
            stages["preprocess"].append(timings.preprocess)
            stages["inference"].append(timings.inference)
            stages["postprocess"].append(timings.postprocess)
            stages["total"].append(item.decode_seconds + elapsed)
            if done >= warmup + frames:
                break
        model_info = detector.info
        backend_name, device = detector.backend.name, detector.backend.device
    total = stages["total"]
    return {
        "scenario": "pipeline",
        "environment": environment(),
        "backend": backend_name,
        "device": device,
        "model": {
            "path": str(model_info.path),
            "sha256": model_info.sha256,
            "input_hw": list(model_info.input_hw),
        },
        "input_shape": input_shape,
        "input_hw_used": list(used_hw),
        "source": {"path": source, "width": info.width, "height": info.height, "fps": info.fps},
        "frames": len(total),
        "warmup_frames": warmup,
        "latency_ms": {k: summarize_ms(v) for k, v in stages.items()},
        "throughput_fps": round(len(total) / sum(total), 2) if total else 0.0,
        "realtime_ratio_vs_source_fps": (
            round(len(total) / sum(total) / info.fps, 3) if total and info.fps else None
        ),
    }


def run_pipeline_shapes_bench(
    model: str | os.PathLike[str],
    backend: str,
    source: str,
    frames: int = 150,
    warmup: int = 10,
) -> dict[str, object]:
    """Square and rectangular inputs on the same frames, interleaved: every decoded frame is
    detected with both, in alternating order, so both see the same load (on a shared machine
    two runs one after the other do not), and the ratio is taken frame by frame."""
    shapes: tuple[InputShape, InputShape] = ("square", "rect")
    times: dict[str, dict[str, list[float]]] = {
        shape: {k: [] for k in ("preprocess", "inference", "postprocess", "total")}
        for shape in shapes
    }
    with (
        Detector.open(model, backend, input_shape="square") as square,
        Detector.open(model, backend, input_shape="rect") as rect,
        SourceReader(source, loop=True) as reader,
    ):
        detectors = {"square": square, "rect": rect}
        info = reader.open()
        source_wh = (info.width, info.height)
        used = {shape: list(d.input_hw(source_wh)) for shape, d in detectors.items()}
        done = 0
        for item in reader.frames():
            if isinstance(item, DecodeError):
                continue
            done += 1
            order = shapes if done % 2 else shapes[::-1]
            for shape in order:
                start = time.perf_counter()
                ((_, timings),) = detectors[shape].detect([item.image_bgr])
                elapsed = time.perf_counter() - start
                if done > warmup:
                    kept = times[shape]
                    kept["preprocess"].append(timings.preprocess)
                    kept["inference"].append(timings.inference)
                    kept["postprocess"].append(timings.postprocess)
                    kept["total"].append(elapsed)
            if done >= warmup + frames:
                break
        backend_name, device = square.backend.name, square.backend.device
    paired = np.asarray(times["rect"]["total"]) / np.asarray(times["square"]["total"])
    inference = np.asarray(times["rect"]["inference"]) / np.asarray(times["square"]["inference"])
    return {
        "scenario": "pipeline_shapes",
        "environment": environment(),
        "backend": backend_name,
        "device": device,
        # the file's name: where it lay on the measuring machine says nothing
        "source": {
            "path": Path(source).name,
            "width": info.width,
            "height": info.height,
            "fps": info.fps,
        },
        "frames": len(paired),
        "warmup_frames": warmup,
        "input_hw_used": used,
        "latency_ms": {
            shape: {k: summarize_ms(v) for k, v in stages.items()}
            for shape, stages in times.items()
        },
        # per frame, rect / square (decode excluded: both detect the same decoded frame)
        "rect_over_square_detect_time_p50": round(percentiles(paired, (50,))["p50"], 3),
        "rect_over_square_inference_time_p50": round(percentiles(inference, (50,))["p50"], 3),
    }


def _progress(done: int, total: int, label: str) -> None:
    """A one-line progress bar on stderr (long runs say where they are)."""
    width = 24
    filled = width * done // max(total, 1)
    end = "\n" if done >= total else ""
    print(
        f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {label:<24}",
        end=end,
        file=sys.stderr,
        flush=True,
    )


def run_engine_bench(
    model: str | os.PathLike[str],
    backend: str,
    batches: list[int],
    iterations: int = 20,
    warmup: int = 3,
    seed: int = 0,
) -> dict[str, object]:
    """The inference backend alone (no decode, pre- or postprocess): latency per call and
    images per second at each batch size, on random inputs of the model's shape.

    A batch above the backend's own maximum is split by the backend, as in the service.
    """
    if not batches or any(b < 1 for b in batches):
        raise ValueError(f"batches must be positive sizes, got {batches}")
    rng = np.random.default_rng(seed)
    runs = []
    with Detector.open(model, backend) as detector:
        info = detector.info
        h, w = info.input_hw
        for i, batch in enumerate(batches):
            _progress(i, len(batches), f"batch {batch}")
            x = rng.random((batch, 3, h, w), dtype=np.float32)
            for _ in range(warmup):
                detector.backend.infer(x)
            times = []
            for _ in range(iterations):
                started = time.perf_counter()
                detector.backend.infer(x)
                times.append(time.perf_counter() - started)
            latency = summarize_ms(times)
            runs.append(
                {
                    "batch": batch,
                    "latency_ms": latency,
                    "images_per_s": round(batch * 1e3 / latency["p50"], 2),
                }
            )
        _progress(len(batches), len(batches), "done")
        backend_name, device = detector.backend.name, detector.backend.device
        max_batch = detector.backend.max_batch
    return {
        "scenario": "engine",
        "environment": environment(),
        "backend": backend_name,
        "device": device,
        "max_batch": max_batch,
        "model": {"path": str(info.path), "sha256": info.sha256, "input_hw": [h, w]},
        "iterations": iterations,
        "runs": runs,
    }


GPU_SCRIPTS = {"kernels": "kernels.py", "gpu-pipeline": "pipeline.py", "streams": "streams.py"}


def gpu_script(scenario: str) -> Path:
    """The GPU benchmark script of a scenario, from the source checkout vdet runs from."""
    root = Path(__file__).resolve().parents[3]  # service/vdet/bench/pipeline.py -> the checkout
    script = root / "bench" / "gpu" / GPU_SCRIPTS[scenario]
    if not script.is_file():
        raise FileNotFoundError(
            f"`vdet bench {scenario}` runs {script.relative_to(root)} of a source checkout "
            f"(it needs a CUDA GPU, PyNvVideoCodec and torch); this vdet is installed from "
            f"{root}, which has none: clone the repository and run it there"
        )
    return script
