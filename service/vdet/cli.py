"""The `vdet` command line: serve, detect, eval, export, quantize, engine, generate, bench.

Each subcommand parses its arguments and hands over to the module that owns the work; nothing
here computes anything itself. Errors a user can fix exit with status 2 and one clear line.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

from vdet.core import contract
from vdet.core.assets import asset_path

if TYPE_CHECKING:
    from vdet.core.types import Detections, ImageArray, StageTimings
    from vdet.inference.detector import Detector

DEMO_SOURCE_ID = "demo"
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff"}


class UsageError(Exception):
    """A problem with the command's input that the user can fix."""


def _add_input_shape_arg(p: argparse.ArgumentParser, both: bool = False) -> None:
    p.add_argument(
        "--input-shape",
        choices=("rect", "square", "both") if both else ("rect", "square"),
        default="rect",
        help="rect: the smallest input that holds the frame (where the backend allows); "
        "square: the model's input size" + ("; both: measure each, same run" if both else ""),
    )


def _add_detection_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", type=Path, default=None, help="ONNX model (default: demo model)")
    p.add_argument("--backend", default="auto", help="auto, onnxruntime, torch, tensorrt")
    _add_input_shape_arg(p)
    p.add_argument("--conf", type=float, default=contract.CONF_THRESHOLD, help="score threshold")
    p.add_argument("--iou", type=float, default=contract.IOU_THRESHOLD, help="NMS IoU threshold")
    p.add_argument("--max-det", type=int, default=contract.MAX_DET)
    p.add_argument("--classes", default=None, help="comma-separated class names or ids")


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vdet", description="Real-time video object detection.")
    parser.add_argument("--log-level", default="info")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="run the HTTP/WebSocket service")
    p.add_argument("--config", type=Path, default=None, help="YAML settings file")
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=None)
    p.add_argument(
        "--no-demo",
        action="store_true",
        help="don't add the looping demo source when no sources are configured",
    )
    p.set_defaults(func=_cmd_serve)

    p = sub.add_parser("detect", help="detect objects in an image or a video; JSON lines out")
    p.add_argument("source", help="image file, video file or stream URL")
    _add_detection_args(p)
    p.add_argument("--max-frames", type=int, default=None, help="stop after N frames")
    p.add_argument("--output", type=Path, default=None, help="write an annotated image/video")
    p.add_argument(
        "--pass-damaged",
        action="store_true",
        help="detect on frames decoded from a damaged reference chain too (default: drop "
        "them until the next keyframe)",
    )
    p.set_defaults(func=_cmd_detect)

    p = sub.add_parser(
        "eval",
        help="COCO mAP of a model on a labelled image set; --track: IDF1/MOTA and counts",
    )
    p.add_argument("--model", type=Path, default=None)
    p.add_argument("--backend", default="auto")
    _add_input_shape_arg(p)
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
        "zone/line counts on a counting clip (needs vdet[eval])",
    )
    p.add_argument("--clips", type=int, default=3, help="--track: synthetic clips (seeds 0..N-1)")
    p.add_argument("--seconds", type=float, default=8.0, help="--track: length of each clip")
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser("export", help="Ultralytics .pt -> ONNX with the raw head")
    p.add_argument("weights", help=".pt checkpoint or Ultralytics model .yaml")
    p.add_argument("--output", type=Path, required=True)
    p.add_argument("--imgsz", type=int, default=contract.INPUT_SIZE)
    p.add_argument("--dynamic", action="store_true", help="symbolic batch axis")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--opset", type=int, default=17)
    p.set_defaults(func=_cmd_export)

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
    p.set_defaults(func=_cmd_quantize)

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
    p.set_defaults(func=_cmd_engine_build)
    p = engine.add_parser("inspect", help="a plan's manifest, whether it is intact, its I/O")
    p.add_argument("plan", type=Path)
    p.set_defaults(func=_cmd_engine_inspect)

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
    p.set_defaults(func=_cmd_generate)

    p = sub.add_parser(
        "bench",
        help="benchmarks; results as JSON",
        description="pipeline: one clip through decode -> detector, per stage; engine: the "
        "backend alone at each batch size; tracking: the tracker's cost per frame beside the "
        "detector's (--frames: detector frames); kernels, gpu-pipeline, streams: the GPU "
        "benchmarks of a source checkout (bench/gpu/*.py; arguments after -- go to them); serve: "
        "a real `vdet serve` driven over HTTP and WebSocket; report: result JSON -> markdown and "
        "plots.",
    )
    p.add_argument(
        "scenario",
        choices=[
            "pipeline",
            "engine",
            "tracking",
            "kernels",
            "gpu-pipeline",
            "streams",
            "serve",
            "report",
        ],
        help="what to measure, or report",
    )
    p.add_argument("inputs", nargs="*", type=Path, help="report: result JSON files")
    p.add_argument(
        "--batches", default="1,2,4,8,16,32,64", help="engine: comma-separated batch sizes"
    )
    p.add_argument("--iterations", type=int, default=20, help="engine: timed calls per batch")
    p.add_argument("--out-dir", type=Path, default=None, help="report: where to write them")
    p.add_argument("--model", type=Path, default=None)
    p.add_argument("--backend", default="auto")
    _add_input_shape_arg(p, both=True)
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
    p.set_defaults(func=_cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except UsageError as exc:
        print(f"vdet {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _cmd_serve(args: argparse.Namespace) -> int:
    from vdet.api.app import create_app
    from vdet.api.server import GracefulServer, server_config
    from vdet.config.base import ConfigError
    from vdet.config.settings import CONFIG_ENV_VAR, load_settings
    from vdet.config.streams import StreamSpec

    if args.config is not None:
        # Parts that read the settings themselves (the tensorrt backend's engine settings)
        # must see the same file.
        os.environ[CONFIG_ENV_VAR] = str(args.config)
    overrides: dict[str, object] = {}
    if args.host:
        overrides["host"] = args.host
    if args.port:
        overrides["port"] = args.port
    try:
        settings = load_settings(args.config, **overrides)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    if not settings.sources and not args.no_demo:
        demo = StreamSpec(
            id=DEMO_SOURCE_ID, url=str(asset_path("sample.mp4")), loop=True, realtime=True
        )
        settings = settings.model_copy(update={"sources": [demo]})
    if not settings.model_path.is_file():
        raise UsageError(f"model not found: {settings.model_path}")
    app = create_app(settings, freeze_startup_objects=True)
    config = server_config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        header_timeout_s=settings.limits.header_timeout_s,
    )
    GracefulServer(config, app).run()  # WebSocket goodbyes, then exit 0 on SIGTERM
    return 0


def _detector(args: argparse.Namespace) -> tuple[Detector, contract.PostprocessParams]:
    from vdet.core.model import ModelError
    from vdet.inference.detector import Detector
    from vdet.streams.params import resolve_classes

    model = args.model or asset_path("demo.onnx")
    try:
        detector = Detector.open(model, args.backend, input_shape=args.input_shape)
    except (FileNotFoundError, ModelError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    try:
        refs = [c.strip() for c in args.classes.split(",")] if args.classes else None
        classes = resolve_classes(refs, detector.info.names)
        params = contract.PostprocessParams(
            conf_threshold=args.conf, iou_threshold=args.iou, max_det=args.max_det, classes=classes
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return detector, params


def _cmd_detect(args: argparse.Namespace) -> int:
    import cv2

    from vdet.ingest.reader import DamagedFrame, DecodeError, SourceReader
    from vdet.ingest.urls import redact, validate_source_url
    from vdet.modelkit.dataset.writers import ClipWriter
    from vdet.streams.pictures import draw_detections

    detector, params = _detector(args)
    names = detector.info.names
    source = args.source
    if Path(source).suffix.lower() in IMAGE_SUFFIXES:
        image = (
            cast("ImageArray | None", cv2.imread(source, cv2.IMREAD_COLOR))
            if Path(source).is_file()
            else None
        )
        if image is None:
            raise UsageError(f"cannot read image {source}")
        ((dets, timings),) = detector.detect([image], params)
        print(json.dumps(_frame_record(0, None, dets, names, timings)))
        if args.output:
            cv2.imwrite(str(args.output), draw_detections(image, dets, names))
        return 0

    try:
        url = validate_source_url(source)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    writer = None
    frames = damaged = 0
    in_damaged_chain = False
    with SourceReader(url, source_id="detect", pass_damaged_frames=args.pass_damaged) as reader:
        try:
            info = reader.open()
        except Exception as exc:  # PyAV raises many types for an unopenable source
            raise UsageError(redact(f"cannot open {source}: {exc}")) from None
        for item in reader.frames():
            if isinstance(item, DamagedFrame):
                damaged += 1
                if not in_damaged_chain:
                    print(f"vdet detect: {item.message}", file=sys.stderr)
                in_damaged_chain = True
                continue
            if isinstance(item, DecodeError):
                print(
                    f"vdet detect: decode error after frame {frames}: {item.message}",
                    file=sys.stderr,
                )
                continue
            in_damaged_chain = False
            ((dets, timings),) = detector.detect([item.image_bgr], params)
            print(json.dumps(_frame_record(item.index, item.pts_seconds, dets, names, timings)))
            if args.output:
                if writer is None:
                    writer = ClipWriter(args.output, fps=info.fps or 30.0, crf=20)
                writer.write(draw_detections(item.image_bgr, dets, names))
            frames += 1
            if args.max_frames is not None and frames >= args.max_frames:
                break
    if writer is not None:
        writer.close()
    if reader.decode_errors or damaged:
        action = "passed on" if args.pass_damaged else "dropped"
        print(
            f"vdet detect: {reader.decode_errors} packet(s) failed to decode; {damaged} "
            f"frame(s) of damaged reference chains {action}",
            file=sys.stderr,
        )
    return 0


def _frame_record(
    index: int,
    pts: float | None,
    dets: Detections,
    names: Sequence[str],
    timings: StageTimings,
) -> dict[str, object]:
    return {
        "frame": index,
        "pts": pts,
        "detections": [
            {
                "class": names[int(c)],
                "class_id": int(c),
                "score": round(float(s), 4),
                "box": [round(float(v), 1) for v in box],
            }
            for box, s, c in zip(dets.xyxy, dets.scores, dets.class_ids, strict=True)
        ],
        "timings_ms": {
            "preprocess": round(timings.preprocess * 1e3, 3),
            "inference": round(timings.inference * 1e3, 3),
            "postprocess": round(timings.postprocess * 1e3, 3),
        },
    }


def _eval_detector(args: argparse.Namespace) -> Detector:
    """The detector `vdet eval` (and `eval --track`) scores; a bad model is a usage error."""
    from vdet.core.model import ModelError
    from vdet.inference.detector import Detector

    try:
        return Detector.open(
            args.model or asset_path("demo.onnx"), args.backend, input_shape=args.input_shape
        )
    except (FileNotFoundError, ModelError, ValueError) as exc:
        raise UsageError(str(exc)) from None


def _print_report(args: argparse.Namespace, report: dict[str, object]) -> int:
    """Print an evaluation report with the machine it ran on; also to --output when given."""
    from vdet.bench.pipeline import environment

    text = json.dumps({**report, "environment": environment()}, indent=2)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text + "\n")
    print(text)
    return 0


def _cmd_eval(args: argparse.Namespace) -> int:
    from vdet.modelkit.evaluation import evaluate

    if args.track:
        return _cmd_eval_track(args)
    coco = args.coco
    if coco is None:
        coco = _heldout_set(args.cache_dir, args.synthetic)
    elif not coco.is_file():
        raise UsageError(f"COCO file not found: {coco}")
    detector = _eval_detector(args)
    with detector:
        report = evaluate(
            detector, coco, args.images, batch_size=args.batch, progress=_progress("eval")
        )
    return _print_report(args, json.loads(report.to_json()))


def _cmd_eval_track(args: argparse.Namespace) -> int:
    import importlib.util

    if importlib.util.find_spec("motmetrics") is None:
        raise UsageError("--track needs py-motmetrics: pip install 'vdet[eval]'")
    if not 1 <= args.clips <= 100 or not 1.0 <= args.seconds <= 600.0:
        raise UsageError("--clips must be 1..100 and --seconds 1..600")
    from vdet.modelkit.tracking_evaluation import evaluate_tracking

    detector = _eval_detector(args)
    with detector:
        report = evaluate_tracking(
            detector, range(args.clips), seconds=args.seconds, progress=_progress("eval --track")
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
        write_dataset(root, {"heldout": range(HELDOUT_SEED_BASE, HELDOUT_SEED_BASE + count)})
    return coco


def _progress(label: str) -> Callable[[int, int], None]:
    def report(done: int, total: int) -> None:
        if sys.stderr.isatty() or done == total or done % max(total // 10, 1) == 0:
            end = "\n" if done == total else "\r"
            print(f"{label}: {done}/{total}", end=end, file=sys.stderr, flush=True)

    return report


def _cmd_export(args: argparse.Namespace) -> int:
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


def _cmd_quantize(args: argparse.Namespace) -> int:
    from vdet.core.model import ModelError, load_model_info
    from vdet.modelkit.quantize import (
        QuantizeError,
        collect_calibration_frames,
        quantize_onnx,
        quantize_onnx_for_cpu,
        save_calibration_frames,
    )

    model = args.model or asset_path("demo.onnx")
    excluded = [] if args.no_exclude else args.exclude
    try:
        info = load_model_info(model)
        frames = collect_calibration_frames(
            args.source, info.input_hw, args.frames, every=args.every, allow_fewer=args.allow_fewer
        )
        if args.save_frames:
            save_calibration_frames(frames, args.save_frames)
        if args.target == "cpu":
            result = quantize_onnx_for_cpu(
                model, args.output, frames, method=args.method or "max", nodes_to_exclude=excluded
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


def _cmd_engine_build(args: argparse.Namespace) -> int:
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


def _cmd_engine_inspect(args: argparse.Namespace) -> int:
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


def _cmd_generate(args: argparse.Namespace) -> int:
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


def _cmd_bench(args: argparse.Namespace) -> int:
    if args.scenario == "report":
        from vdet.bench_report import run_cli

        return run_cli(args.inputs, args.out_dir)
    if args.scenario == "serve":
        from vdet.bench.serve.command import run_cli as run_serve_cli

        return run_serve_cli(args)
    from vdet.bench.pipeline import (
        GPU_SCRIPTS,
        gpu_script,
        run_engine_bench,
        run_pipeline_bench,
        run_pipeline_shapes_bench,
    )

    if args.scenario in GPU_SCRIPTS:
        import subprocess

        try:
            script = gpu_script(args.scenario)
        except FileNotFoundError as exc:
            print(f"vdet bench: {exc}", file=sys.stderr)
            return 2
        forwarded = [str(p) for p in args.inputs]
        if args.output:
            forwarded += ["--out", str(args.output)]
        return subprocess.run([sys.executable, str(script), *forwarded], check=False).returncode
    model = args.model or asset_path("demo.onnx")
    result: dict[str, object]
    if args.scenario == "engine":
        try:
            batches = [int(b) for b in args.batches.split(",") if b.strip()]
        except ValueError:
            print(f"vdet bench: --batches must be integers, got {args.batches!r}", file=sys.stderr)
            return 2
        result = run_engine_bench(model, args.backend, batches, iterations=args.iterations)
    elif args.scenario == "tracking":
        from vdet.bench.tracking import run_tracking_bench

        result = run_tracking_bench(
            model=str(model),
            backend=args.backend,
            source=args.source or str(asset_path("sample.mp4")),
            detector_frames=args.frames,
        )
    else:
        source = args.source or str(asset_path("sample.mp4"))
        if args.baseline == "ultralytics":
            from vdet.bench.ultralytics import run_pipeline_vs_ultralytics

            if args.backend not in ("auto", "onnxruntime") or args.input_shape != "rect":
                print(
                    "vdet bench: --baseline ultralytics compares ONNX Runtime on the CPU with "
                    "rect inputs (Ultralytics' default); drop --backend/--input-shape",
                    file=sys.stderr,
                )
                return 2
            try:
                result = run_pipeline_vs_ultralytics(
                    model, source, frames=args.frames, warmup=args.warmup
                )
            except RuntimeError as exc:
                print(f"vdet bench: {exc}", file=sys.stderr)
                return 2
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
    text = json.dumps(result, indent=2)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
