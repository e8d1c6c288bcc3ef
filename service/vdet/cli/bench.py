"""`vdet bench pipeline|engine|tracking|serve`: the benchmarks an operator runs (vdet.bench),
each writing its result as JSON with the machine it ran on."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from vdet.cli.args import activity, add_input_shape_arg
from vdet.core.assets import default_model_path, sample_clip


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "bench",
        help="benchmarks; results as JSON",
        description="pipeline: one clip through decode -> detector, per stage; engine: the "
        "backend alone at each batch size; tracking: the tracker's cost per frame beside the "
        "detector's (--frames: detector frames); serve: a real `vdet serve` driven over HTTP "
        "and WebSocket (docs/bench-serve.md).",
    )
    p.add_argument(
        "scenario", choices=["pipeline", "engine", "tracking", "serve"], help="what to measure"
    )
    p.add_argument(
        "--batches", default="1,2,4,8,16,32,64", help="engine: comma-separated batch sizes"
    )
    p.add_argument("--iterations", type=int, default=20, help="engine: timed calls per batch")
    p.add_argument("--model", type=Path, default=None)
    p.add_argument("--backend", default="auto")
    add_input_shape_arg(p, both=True)
    p.add_argument("--source", default=None, help="video (default: the sample clip)")
    p.add_argument("--frames", type=int, default=150)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument(
        "--baseline",
        choices=["ultralytics"],
        default=None,
        help="pipeline: also run Ultralytics' predict on the same model and clip, alternating "
        "with vdet in blocks of frames; frames/s of each, their ratio and box agreement "
        "(needs the train extra; onnxruntime backend, rect inputs); serve: run that for "
        "--frames frames before and after the variants, for a same-run baseline",
    )
    p.add_argument("--output", type=Path, default=None)
    from vdet.bench.serve.options import add_arguments as add_serve_arguments

    add_serve_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.scenario == "serve":
        from vdet.bench.serve.command import run_cli as run_serve_cli

        return run_serve_cli(args)
    with activity(f"vdet bench {args.scenario}"):
        result = _measure(args)
    if result is None:
        return 2
    text = json.dumps(result, indent=2)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text + "\n")
    print(text)
    return 0


def _measure(args: argparse.Namespace) -> dict[str, object] | None:
    """The scenario's result, or None after saying on stderr why it cannot run."""
    from vdet.bench.engine import run_engine_bench
    from vdet.bench.pipeline import run_pipeline_bench, run_pipeline_shapes_bench

    model = args.model or default_model_path()
    result: dict[str, object]
    if args.scenario == "engine":
        try:
            batches = [int(b) for b in args.batches.split(",") if b.strip()]
        except ValueError:
            print(f"vdet bench: --batches must be integers, got {args.batches!r}", file=sys.stderr)
            return None
        result = run_engine_bench(model, args.backend, batches, iterations=args.iterations)
    elif args.scenario == "tracking":
        from vdet.bench.tracking import run_tracking_bench

        result = run_tracking_bench(
            model=str(model),
            backend=args.backend,
            source=args.source or str(sample_clip()),
            detector_frames=args.frames,
        )
    else:
        source = args.source or str(sample_clip())
        if args.baseline == "ultralytics":
            from vdet.bench.ultralytics import run_pipeline_vs_ultralytics

            if args.backend not in ("auto", "onnxruntime") or args.input_shape != "rect":
                print(
                    "vdet bench: --baseline ultralytics compares ONNX Runtime on the CPU with "
                    "rect inputs (Ultralytics' default); drop --backend/--input-shape",
                    file=sys.stderr,
                )
                return None
            try:
                result = run_pipeline_vs_ultralytics(
                    model, source, frames=args.frames, warmup=args.warmup
                )
            except RuntimeError as exc:
                print(f"vdet bench: {exc}", file=sys.stderr)
                return None
        elif args.input_shape == "both":
            result = run_pipeline_shapes_bench(
                model=model,
                backend=args.backend,
                source=source,
                frames=args.frames,
                warmup=args.warmup,
            )
        else:
            result = run_pipeline_bench(
                model=model,
                backend=args.backend,
                source=source,
                frames=args.frames,
                warmup=args.warmup,
                input_shape=args.input_shape,
            )
    return result
