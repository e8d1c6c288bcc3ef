"""The model commands: `vdet eval` (COCO mAP; --track: IDF1/MOTA and counts), `vdet export`
(an Ultralytics checkpoint to ONNX with the raw head), `vdet quantize` (INT8 Q/DQ ONNX),
`vdet engine build|inspect` (TensorRT plans) and `vdet generate` (synthetic data with exact
truth). Each hands over to vdet.modelkit or vdet.tensorrt."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vdet.cli.args import UsageError, activity, add_input_shape_arg, progress
from vdet.core import contract
from vdet.core.assets import default_model_path
from vdet.core.extras import needs_extra

if TYPE_CHECKING:
    from vdet.inference.detector import Detector


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "eval",
        help="COCO mAP of a model on a labelled image set; --track: IDF1/MOTA and counts",
    )
    p.add_argument("--model", type=Path, default=None)
    p.add_argument("--backend", default="auto")
    add_input_shape_arg(p)
    p.add_argument("--coco", type=Path, default=None, help="COCO JSON (default: synthetic set)")
    p.add_argument("--images", type=Path, default=None, help="image root of the COCO file")
    p.add_argument("--synthetic", type=int, default=500, help="held-out synthetic images")
    p.add_argument("--cache-dir", type=Path, default=Path(".cache/heldout"))
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--output", type=Path, default=None, help="write the JSON report here")
    p.add_argument(
        "--track",
        action="store_true",
        help="score tracking instead: IDF1/MOTA on synthetic clips with identities, and exact "
        "zone/line counts on a counting clip (needs the eval extra: "
        "scripts/setup.sh --extras eval)",
    )
    p.add_argument("--clips", type=int, default=3, help="--track: synthetic clips (seeds 0..N-1)")
    p.add_argument("--seconds", type=float, default=8.0, help="--track: length of each clip")
    p.set_defaults(func=_eval)

    p = sub.add_parser("export", help="Ultralytics .pt -> ONNX with the raw head")
    p.add_argument("weights", help=".pt checkpoint or Ultralytics model .yaml")
    p.add_argument("--output", type=Path, required=True)
    p.add_argument("--imgsz", type=int, default=contract.INPUT_SIZE)
    p.add_argument("--dynamic", action="store_true", help="symbolic batch axis")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--opset", type=int, default=17)
    p.set_defaults(func=_export)

    p = sub.add_parser(
        "quantize", help="INT8 calibration into a Q/DQ ONNX (TensorRT, or ONNX Runtime on the CPU)"
    )
    p.add_argument("source", help="calibration images folder, video file, stream URL or .npy")
    p.add_argument("--model", type=Path, default=None, help="FP32 ONNX (default: demo model)")
    p.add_argument("--output", type=Path, required=True, help="Q/DQ ONNX to write")
    p.add_argument(
        "--target",
        choices=["tensorrt", "cpu"],
        default="tensorrt",
        help="tensorrt: symmetric int8 for TensorRT's explicit quantization (ModelOpt); cpu: "
        "uint8 activations and per-channel int8 conv weights, what ONNX Runtime's CPU kernels "
        "run fast",
    )
    p.add_argument(
        "--method",
        choices=["entropy", "max"],
        default=None,
        help="calibration (default: entropy for tensorrt, max for cpu)",
    )
    p.add_argument("--frames", type=int, default=500, help="calibration frames")
    p.add_argument("--every", type=int, default=None, help="take every k-th frame/file")
    p.add_argument("--allow-fewer", action="store_true", help="accept fewer frames than asked")
    p.add_argument(
        "--exclude",
        action="append",
        default=None,
        metavar="REGEX",
        help="node names kept in high precision (repeatable; default: tuned list)",
    )
    p.add_argument("--no-exclude", action="store_true", help="quantize every eligible node")
    p.add_argument(
        "--high-precision",
        choices=["fp32", "fp16"],
        default="fp32",
        help="type of the layers left unquantized",
    )
    p.add_argument(
        "--save-frames",
        type=Path,
        default=None,
        help="also write the letterboxed calibration frames as .npy",
    )
    p.set_defaults(func=_quantize)

    p = sub.add_parser("engine", help="TensorRT engines: build into the cache, inspect a plan")
    engine = p.add_subparsers(dest="engine_command", required=True)
    p = engine.add_parser(
        "build", help="ONNX -> TensorRT plan in the engine cache (reused when still valid)"
    )
    p.add_argument("--config", type=Path, default=None, help="YAML settings file (as serve)")
    p.add_argument("--model", type=Path, default=None, help="ONNX (default: settings' model)")
    p.add_argument("--cache-dir", type=Path, default=None, help="engine cache folder")
    p.add_argument("--precision", choices=["auto", "fp32", "fp16", "int8"], default=None)
    p.add_argument("--min-batch", type=int, default=None)
    p.add_argument("--opt-batch", type=int, default=None)
    p.add_argument("--max-batch", type=int, default=None)
    p.add_argument("--workspace-mib", type=int, default=None, help="builder workspace limit")
    p.add_argument("--opt-level", type=int, default=None, help="builder optimization level 0-5")
    p.add_argument("--timing-cache", type=Path, default=None, help="timing cache file")
    p.add_argument(
        "--plugin-nms", action="store_true", help="end-to-end engine with the decode + NMS plugin"
    )
    p.add_argument("--plugin-library", type=Path, default=None, help="libvdet_plugins.so")
    p.add_argument("--device", type=int, default=0, help="CUDA device index")
    p.add_argument(
        "--library",
        choices=["tensorrt", "tensorrt-rtx"],
        default=None,
        help="full TensorRT or TensorRT for RTX (default: the settings' backend if it names one, "
        "TensorRT for RTX with --target, else whichever is installed, full TensorRT first)",
    )
    p.add_argument(
        "--target",
        default=None,
        help="TensorRT for RTX: compute capabilities to build for, e.g. sm86 or sm86,sm89 "
        "(no GPU needed); default: this machine's GPU",
    )
    p.set_defaults(func=_engine_build)
    p = engine.add_parser("inspect", help="a plan's manifest, whether it is intact, its I/O")
    p.add_argument("plan", type=Path)
    p.set_defaults(func=_engine_inspect)

    p = sub.add_parser("generate", help="render a synthetic dataset or a clip with truth")
    p.add_argument(
        "kind",
        choices=["dataset", "clip", "counting-clip"],
        help="counting-clip: objects crossing a known line and entering a known zone, with "
        "the zones and the expected counts in its JSON",
    )
    p.add_argument("--output", type=Path, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--count", type=int, default=100, help="images (dataset)")
    p.add_argument("--seconds", type=float, default=10.0, help="length (clip)")
    p.add_argument("--fps", type=int, default=30)
    p.set_defaults(func=_generate)


def _eval_detector(args: argparse.Namespace) -> Detector:
    """The detector `vdet eval` (and `eval --track`) scores; a bad model is a usage error."""
    from vdet.core.model import ModelError
    from vdet.inference.detector import Detector

    try:
        return Detector.open(
            args.model or default_model_path(), args.backend, input_shape=args.input_shape
        )
    except (FileNotFoundError, ModelError, ValueError) as exc:
        raise UsageError(str(exc)) from None


def _print_report(args: argparse.Namespace, report: dict[str, object]) -> int:
    """Print an evaluation report with the machine it ran on; also to --output when given."""
    from vdet.bench.environment import environment

    text = json.dumps({**report, "environment": environment()}, indent=2)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text + "\n")
    print(text)
    return 0


def _eval(args: argparse.Namespace) -> int:
    from vdet.modelkit.evaluation import evaluate

    if args.track:
        return _eval_track(args)
    coco = args.coco
    if coco is None:
        coco = _heldout_set(args.cache_dir, args.synthetic)
    elif not coco.is_file():
        raise UsageError(f"COCO file not found: {coco}")
    detector = _eval_detector(args)
    with detector:
        report = evaluate(
            detector, coco, args.images, batch_size=args.batch, progress=progress("eval")
        )
    return _print_report(args, json.loads(report.to_json()))


def _eval_track(args: argparse.Namespace) -> int:
    import importlib.util

    if importlib.util.find_spec("motmetrics") is None:
        raise UsageError(needs_extra("--track (py-motmetrics)", "eval"))
    if not 1 <= args.clips <= 100 or not 1.0 <= args.seconds <= 600.0:
        raise UsageError("--clips must be 1..100 and --seconds 1..600")
    from vdet.modelkit.tracking_evaluation import evaluate_tracking

    detector = _eval_detector(args)
    with detector:
        report = evaluate_tracking(
            detector, range(args.clips), seconds=args.seconds, progress=progress("eval --track")
        )
    return _print_report(args, json.loads(report.to_json()))


def _heldout_set(cache_dir: Path, count: int) -> Path:
    """The held-out synthetic evaluation set, rendered once into `cache_dir`."""
    from vdet.modelkit.dataset.writers import write_dataset
    from vdet.modelkit.train import HELDOUT_SEED_BASE

    root = cache_dir / f"heldout-{count}"
    coco = root / "heldout_coco.json"
    if not coco.is_file():
        print(f"rendering {count} held-out synthetic images into {root}", file=sys.stderr)
        write_dataset(
            root,
            {"heldout": range(HELDOUT_SEED_BASE, HELDOUT_SEED_BASE + count)},
            progress=progress("rendering the held-out set"),
        )
    return coco


def _export(args: argparse.Namespace) -> int:
    from vdet.modelkit.export import ExportError, export_onnx

    try:
        info = export_onnx(
            args.weights,
            args.output,
            imgsz=args.imgsz,
            dynamic_batch=args.dynamic,
            batch=args.batch,
            opset=args.opset,
        )
    except ExportError as exc:
        raise UsageError(str(exc)) from None
    print(
        json.dumps(
            {
                "output": str(args.output),
                "classes": list(info.names),
                "input_hw": list(info.input_hw),
                "batch": info.batch,
                "sha256": info.sha256,
            }
        )
    )
    return 0


def _quantize(args: argparse.Namespace) -> int:
    from vdet.core.model import ModelError, load_model_info
    from vdet.modelkit.quantize import (
        QuantizeError,
        collect_calibration_frames,
        quantize_onnx,
        quantize_onnx_for_cpu,
        save_calibration_frames,
    )

    model = args.model or default_model_path()
    excluded = [] if args.no_exclude else args.exclude
    try:
        info = load_model_info(model)
        with activity(f"reading {args.frames} calibration frames"):
            frames = collect_calibration_frames(
                args.source,
                info.input_hw,
                args.frames,
                every=args.every,
                allow_fewer=args.allow_fewer,
            )
        if args.save_frames:
            save_calibration_frames(frames, args.save_frames)
        with activity(f"calibrating and quantizing for the {args.target}"):
            if args.target == "cpu":
                result = quantize_onnx_for_cpu(
                    model,
                    args.output,
                    frames,
                    method=args.method or "max",
                    nodes_to_exclude=excluded,
                )
            else:
                result = quantize_onnx(
                    model,
                    args.output,
                    frames,
                    method=args.method or "entropy",
                    nodes_to_exclude=excluded,
                    high_precision=args.high_precision,
                )
    except (FileNotFoundError, ModelError, QuantizeError) as exc:
        raise UsageError(str(exc)) from None
    print(json.dumps(result.to_dict()))
    return 0


def _engine_build(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from vdet.config.base import ConfigError
    from vdet.config.engine import EngineSettings
    from vdet.config.settings import load_settings
    from vdet.tensorrt.build import BuildError, BuildOptions, build_cached
    from vdet.tensorrt.library import FLAVOURS, LibraryError, parse_targets
    from vdet.tensorrt.plugin_library import PluginLibraryError

    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    overrides = {
        "cache_dir": args.cache_dir,
        "precision": args.precision,
        "min_batch": args.min_batch,
        "opt_batch": args.opt_batch,
        "max_batch": args.max_batch,
        "workspace_mib": args.workspace_mib,
        "optimization_level": args.opt_level,
        "timing_cache": args.timing_cache,
        "plugin_library": args.plugin_library,
        "plugin_nms": True if args.plugin_nms else None,
    }
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        engine = EngineSettings.model_validate({**settings.engine.model_dump(), **given})
    except ValidationError as exc:
        raise UsageError(f"invalid engine options: {exc}") from None
    model = args.model or settings.model_path
    if not Path(model).is_file():
        raise UsageError(f"model not found: {model}")
    try:
        targets = parse_targets(args.target) if args.target is not None else None
    except LibraryError as exc:
        raise UsageError(str(exc)) from None
    flavour = args.library or (settings.backend if settings.backend in FLAVOURS else None)
    if flavour is None and targets is not None:
        flavour = "tensorrt-rtx"
    try:
        options = BuildOptions.from_settings(engine, settings.detection)
        with activity(f"building the engine (or reading it from {engine.cache_dir})"):
            cached = build_cached(
                model, options, engine.cache_dir, device=args.device, lib=flavour, targets=targets
            )
    except PluginLibraryError as exc:
        raise UsageError(str(exc)) from None
    except BuildError as exc:
        print(f"vdet engine build: {exc}", file=sys.stderr)
        return 1
    manifest = cached.manifest
    print(
        json.dumps(
            {
                "plan": str(cached.plan),
                "built": cached.built,
                "precision": manifest.key.precision,
                "profile": manifest.key.profile.label,
                "gpu": manifest.key.gpu_name,
                "library": manifest.key.flavour,
                "tensorrt": manifest.key.tensorrt_version,
                "compute_capability": manifest.key.compute_capability,
                "build_seconds": manifest.build_seconds,
            }
        )
    )
    return 0


def _engine_inspect(args: argparse.Namespace) -> int:
    from vdet.tensorrt.build import BuildError, can_deserialize, inspect_plan, tensorrt_io

    if not args.plan.is_file():
        raise UsageError(f"plan not found: {args.plan}")
    deserialize = tensorrt_io if can_deserialize(args.plan) else None
    try:
        report = inspect_plan(args.plan, deserialize=deserialize)
    except BuildError as exc:
        report = {**inspect_plan(args.plan), "engine_error": str(exc)}
    print(json.dumps(report, indent=2, default=str))
    return 0 if report.get("valid") else 1


def _generate(args: argparse.Namespace) -> int:
    from vdet.modelkit.dataset.writers import (
        write_counting_clip,
        write_dataset,
        write_video_with_truth,
    )

    if args.kind == "dataset":
        paths = write_dataset(args.output, {"images": range(args.seed, args.seed + args.count)})
        print(json.dumps({k: str(v) for k, v in paths.items()}))
    elif args.kind == "counting-clip":
        truth = write_counting_clip(args.output, args.seed, seconds=args.seconds, fps=args.fps)
        print(json.dumps({"clip": str(args.output), "truth": str(truth)}))
    else:
        truth = write_video_with_truth(args.output, args.seed, seconds=args.seconds, fps=args.fps)
        print(json.dumps({"clip": str(args.output), "truth": str(truth)}))
    return 0
