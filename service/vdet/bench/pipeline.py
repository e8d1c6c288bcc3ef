"""`vdet bench pipeline`: one clip through decode -> detector, per stage, as the service calls
them (`SourceReader`, `Detector`); with `--input-shape both`, rect against square inputs in the
same run. Each result carries the machine (vdet.bench.environment) and its percentiles come
from vdet.bench.stats."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from vdet.bench.environment import environment
from vdet.bench.stats import percentiles, summarize_ms
from vdet.inference.detector import Detector, InputShape
from vdet.ingest.reader import DecodeError, SourceReader


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
