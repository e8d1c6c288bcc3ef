"""INT8 accuracy studies, run once by hand and committed: layer sensitivity and FP32/FP16/INT8 mAP.

    python -m vdet.modelkit.quant_study sensitivity --calib /tmp/vdet-cache/calib-train-500/images
    python -m vdet.modelkit.quant_study accuracy --calib /tmp/vdet-cache/calib-train-500/images

Both calibrate on frames from the training seed range (render them with
`vdet generate dataset --seed 0 --count 500 --output DIR`), never on the held-out seeds that
`vdet eval` scores, and run every model with ONNX Runtime on the CPU. They are too slow for CI
(minutes per model on two cores); the tests cover the machinery on a handful of frames.

`sensitivity` calibrates once (entropy, every eligible layer quantized), then re-places Q/DQ with
those same activation scales (a calibration cache) so that each group of layers in turn is the
only one left in FP32, or the only one quantized, and scores each variant on a subset of the
held-out images. `accuracy` scores FP32, FP16 and INT8 (each calibration method, with and
without the default exclusions) on the whole held-out set.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vdet.bench.environment import environment
from vdet.core.contract import EVAL_CONF_THRESHOLD, EVAL_IOU_THRESHOLD, EVAL_MAX_DET
from vdet.core.model import load_model_info
from vdet.inference.detector import Detector
from vdet.modelkit.dataset.writers import write_dataset
from vdet.modelkit.evaluation import EvalReport, evaluate
from vdet.modelkit.quantize import (
    CALIBRATION_METHODS,
    DEFAULT_NODES_TO_EXCLUDE,
    CalibrationFrames,
    activation_scales,
    collect_calibration_frames,
    convert_fp16,
    quantize_onnx,
    write_calibration_cache,
)
from vdet.modelkit.train import HELDOUT_SEED_BASE, TRAIN_SEED_BASE

DEMO_MODEL = Path(__file__).resolve().parents[1] / "assets" / "demo.onnx"


@dataclass(frozen=True)
class LayerGroup:
    name: str
    pattern: str  # re.match on node names
    what: str


def yolov8_groups(node_names: Sequence[str]) -> list[LayerGroup]:
    """One group per backbone/neck block, and the Detect head split by role."""
    blocks = sorted({int(m.group(1)) for n in node_names if (m := re.match(r"/model\.(\d+)/", n))})
    head = blocks[-1]
    groups = [LayerGroup(f"model.{i}", rf"/model\.{i}/", _block_role(i, head)) for i in blocks[:-1]]
    groups += [
        LayerGroup(
            "head.box_stem",
            rf"/model\.{head}/cv2\.\d+/cv2\.\d+\.[01]/",
            "Detect box branch, two 3x3 convs per scale",
        ),
        LayerGroup(
            "head.cls_stem",
            rf"/model\.{head}/cv3\.\d+/cv3\.\d+\.[01]/",
            "Detect class branch, two 3x3 convs per scale",
        ),
        LayerGroup(
            "head.box_out",
            rf"/model\.{head}/cv2\.\d+/cv2\.\d+\.2/",
            "Detect box branch final 1x1 conv (64 = 4 x 16 DFL bins)",
        ),
        LayerGroup(
            "head.cls_out",
            rf"/model\.{head}/cv3\.\d+/cv3\.\d+\.2/",
            "Detect class branch final 1x1 conv (class logits)",
        ),
        LayerGroup("head.dfl", rf"/model\.{head}/dfl/", "DFL: softmax over 16 bins, 1x1 conv"),
    ]
    return groups


def _block_role(i: int, head: int) -> str:
    if i <= 9:
        return "backbone" + (" (stem conv)" if i == 0 else " (SPPF)" if i == 9 else "")
    return "neck (PAN-FPN)"


def heldout_coco(cache_dir: Path, count: int = 500) -> Path:
    """The same held-out set `vdet eval` renders by default, in the same cache layout."""
    root = cache_dir / f"heldout-{count}"
    coco = root / "heldout_coco.json"
    if not coco.is_file():
        write_dataset(root, {"heldout": range(HELDOUT_SEED_BASE, HELDOUT_SEED_BASE + count)})
    return coco


def coco_subset(coco: Path, count: int, out: Path) -> Path:
    """The first `count` images (by id) of a COCO file and their annotations."""
    data = json.loads(coco.read_text())
    ids = sorted(image["id"] for image in data["images"])[:count]
    keep = set(ids)
    subset = {
        **data,
        "images": [im for im in data["images"] if im["id"] in keep],
        "annotations": [a for a in data["annotations"] if a["image_id"] in keep],
    }
    out.write_text(json.dumps(subset))
    return out


def score(model: Path, coco: Path, image_root: Path) -> EvalReport:
    with Detector.open(model, "onnxruntime") as detector:
        return evaluate(detector, coco, image_root)


def _metrics(report: EvalReport) -> dict[str, Any]:
    return {
        "map50_95": report.map50_95,
        "map50": report.map50,
        "map75": report.map75,
        "map_small": report.map_small,
        "map_medium": report.map_medium,
        "map_large": report.map_large,
        "per_class_map50_95": report.per_class_map50_95,
        "eval_seconds": report.seconds,
    }


def _tool_versions() -> dict[str, str]:
    from importlib import metadata

    versions = {}
    for name in ("nvidia-modelopt", "onnx", "onnxruntime", "faster-coco-eval"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _calibration_record(frames: CalibrationFrames) -> dict[str, Any]:
    return {
        "source": frames.source,
        "frames": len(frames),
        "available": frames.available,
        "seeds": "training range "
        f"{TRAIN_SEED_BASE}..{TRAIN_SEED_BASE + (frames.available or 0) - 1} "
        "(vdet generate dataset --seed 0), disjoint from the held-out seeds",
    }


def _check_cached_scales(model: Path, cached: dict[str, float]) -> None:
    """Every activation scale of a variant must be the full calibration's, not a new one."""
    import onnx

    for name, scale in activation_scales(onnx.load(str(model))).items():
        if name not in cached or abs(cached[name] - scale) > 1e-6 * cached[name]:
            raise RuntimeError(f"{model.name}: scale of {name} is not from the calibration cache")


def run_sensitivity(args: argparse.Namespace) -> dict[str, Any]:
    model: Path = args.model
    coco = heldout_coco(args.cache_dir)
    info = load_model_info(model)
    frames = collect_calibration_frames(args.calib, info.input_hw, args.frames)
    few = CalibrationFrames(frames.batch[:1], frames.source, frames.picked[:1], frames.available)
    import onnx

    names = [node.name for node in onnx.load(str(model), load_external_data=False).graph.node]
    groups = yolov8_groups(names)
    with tempfile.TemporaryDirectory(prefix="vdet-sensitivity-") as tmp:
        work = Path(tmp)
        subset = coco_subset(coco, args.images, work / "subset.json")
        base: list[str] = list(args.base_exclude or [])
        groups = [g for g in groups if g.pattern not in base]
        all_patterns = [g.pattern for g in groups]  # int8_alone keeps every other group FP32
        _log(f"calibrating {args.method} on {len(frames)} frames, excluded: {base or 'none'}")
        full = quantize_onnx(model, work / "all.onnx", frames, args.method, nodes_to_exclude=base)
        cache = work / "calib.cache"
        cache_scales = activation_scales(onnx.load(str(full.output)))
        write_calibration_cache(cache_scales, cache)

        fp32 = score(model, subset, coco.parent).map50_95
        int8 = score(full.output, subset, coco.parent).map50_95
        _log(f"subset mAP50-95: FP32 {fp32:.4f}, INT8 (all but excluded) {int8:.4f}")
        rows: list[dict[str, Any]] = []
        for group in [g for g in groups if re.match(args.groups, g.name)]:
            row: dict[str, Any] = {
                "group": group.name,
                "pattern": group.pattern,
                "what": group.what,
            }
            variants = {"fp32_alone": [*base, group.pattern]}
            if args.int8_alone == "all" or group.name.startswith("head."):
                variants["int8_alone"] = [p for p in all_patterns if p != group.pattern]
                variants["int8_alone"] += [p for p in base if p not in all_patterns]
            for variant, excluded in variants.items():
                out = work / f"{group.name}-{variant}.onnx"
                result = quantize_onnx(
                    model, out, few, args.method, nodes_to_exclude=excluded, calibration_cache=cache
                )
                _check_cached_scales(out, cache_scales)
                m = score(out, subset, coco.parent).map50_95
                if variant == "fp32_alone":
                    row["convs_in_group"] = len(
                        [n for n in result.summary.float_convs if re.match(group.pattern, n)]
                    )
                    row["fp32_alone_map50_95"] = m
                    row["gain_vs_all_int8_points"] = round((m - int8) * 100, 2)
                else:
                    row["int8_alone_map50_95"] = m
                    row["loss_vs_fp32_points"] = round((fp32 - m) * 100, 2)
                out.unlink()
            _log(f"{group.name}: {row}")
            rows.append(row)
    return {
        "study": "INT8 layer sensitivity, demo YOLOv8n, ONNX Runtime CPU",
        "model": str(args.model),
        "model_sha256": info.sha256,
        "method": args.method,
        "calibration": _calibration_record(frames),
        "eval_images": args.images,
        "eval_set": f"first {args.images} held-out images, seeds {HELDOUT_SEED_BASE}.."
        f"{HELDOUT_SEED_BASE + args.images - 1}",
        "fp32_map50_95": fp32,
        "base_excluded": base,
        "int8_all_layers_map50_95": int8,
        "how": "activation scales calibrated once with every eligible layer quantized (but "
        "base_excluded), then reused (TensorRT calibration cache) while one group at a time "
        "also stays FP32 (fp32_alone) or is the only one quantized (int8_alone); "
        "int8_all_layers_map50_95 is the model with every group but base_excluded quantized",
        "groups": rows,
        "environment": environment(),
    }


def run_accuracy(args: argparse.Namespace) -> dict[str, Any]:
    model: Path = args.model
    coco = heldout_coco(args.cache_dir)
    info = load_model_info(model)
    frames = collect_calibration_frames(args.calib, info.input_hw, args.frames)
    results: list[dict[str, Any]] = []
    header = {
        "study": "FP32 vs FP16 vs INT8 (Q/DQ) accuracy, demo YOLOv8n, ONNX Runtime CPU",
        "model": str(args.model),
        "model_sha256": info.sha256,
        "eval_set": f"synthetic held-out seeds {HELDOUT_SEED_BASE}..{HELDOUT_SEED_BASE + 499} "
        "(vdet eval default), 500 images",
        "calibration": _calibration_record(frames),
        "default_exclusions": list(DEFAULT_NODES_TO_EXCLUDE),
        "target": "INT8 mAP50-95 drop <= 0.5 points vs FP32",
        "environment": environment(),
        "tools": _tool_versions(),
    }

    def record(row: dict[str, Any]) -> None:
        results.append(row)
        row["drop_vs_fp32_points"] = round((results[0]["map50_95"] - row["map50_95"]) * 100, 2)
        _log(
            f"{row['precision']} {row.get('method', '')} {row.get('excluded', '')}: "
            f"{row['map50_95']} ({row['drop_vs_fp32_points']} points below FP32)"
        )
        # Written after every model: a run cut short still leaves what it measured.
        args.output.write_text(json.dumps({**header, "results": results}, indent=2) + "\n")

    with tempfile.TemporaryDirectory(prefix="vdet-accuracy-") as tmp:
        work = Path(tmp)
        fp32 = score(model, coco, coco.parent)
        record({"precision": "FP32", "model_sha256": fp32.model_sha256, **_metrics(fp32)})
        # The shipped configuration first, then FP16, then the ablations without exclusions.
        variants: list[tuple[str, str, list[str] | None]] = [
            (m, "default", None) for m in CALIBRATION_METHODS
        ]
        variants += [(m, "none", []) for m in CALIBRATION_METHODS]
        for method, label, excluded in variants:
            out = work / f"int8-{method}-{label}.onnx"
            q = quantize_onnx(model, out, frames, method, nodes_to_exclude=excluded)
            report = score(out, coco, coco.parent)
            record(
                {
                    "precision": "INT8",
                    "method": method,
                    "excluded": list(q.excluded_patterns),
                    "quantized_convs": len(q.summary.quantized_convs),
                    "float_convs": list(q.summary.float_convs),
                    "calibration_seconds": q.seconds,
                    "model_sha256": q.sha256,
                    **_metrics(report),
                }
            )
            out.unlink()
            if label == "default" and method == CALIBRATION_METHODS[-1]:
                half = convert_fp16(model, work / "fp16.onnx")
                report = score(half, coco, coco.parent)
                record(
                    {
                        "precision": "FP16",
                        "converter": "ModelOpt AutoCast convert_to_f16(keep_io_types=True)",
                        "model_sha256": report.model_sha256,
                        **_metrics(report),
                    }
                )
    return {**header, "results": results}


def accuracy_markdown(report: dict[str, Any]) -> str:
    """The accuracy report as the table committed beside its JSON."""
    env = report["environment"]
    versions = {**env["packages"], **report.get("tools", {})}
    packages = ", ".join(f"{k} {v}" for k, v in versions.items())
    lines = [
        f"# INT8 accuracy on the CPU, {env['date'][:10]}",
        "",
        f"{report['study']}. Eval set: {report['eval_set']}. Calibration: "
        f"{report['calibration']['frames']} frames, {report['calibration']['seeds']}. "
        "Every model run by ONNX Runtime's CPU provider through `vdet eval`'s pipeline "
        f"(letterbox, score threshold {EVAL_CONF_THRESHOLD}, NMS IoU {EVAL_IOU_THRESHOLD}, "
        f"max {EVAL_MAX_DET} detections).",
        "",
        f"Machine: {env['host_cpu']}, {env['cpu_count']} cores, Python {env['python']}, "
        f"{env['platform']}; {packages}. Target: {report['target']}.",
        "",
        "| precision | calibration | kept in FP32 | mAP50-95 | drop (points) | mAP50 | mAP75 "
        "| mAP S / M / L |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for row in report["results"]:
        kept = ", ".join(f"`{c}`" for c in row.get("float_convs", [])) or "-"
        if row["precision"] != "INT8":
            kept = "(all)" if row["precision"] == "FP32" else "-"
        lines.append(
            f"| {row['precision']} | {row.get('method', '-')} | {kept} | "
            f"{row['map50_95']:.4f} | {row['drop_vs_fp32_points']:.2f} | {row['map50']:.4f} | "
            f"{row['map75']:.4f} | {row['map_small']:.3f} / {row['map_medium']:.3f} / "
            f"{row['map_large']:.3f} |"
        )
    lines += ["", f"Source: the JSON beside this file ({report['model_sha256'][:12]}... model)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", choices=["sensitivity", "accuracy", "markdown"])
    parser.add_argument("--calib", type=Path, default=None, help="calibration images folder")
    parser.add_argument("--model", type=Path, default=DEMO_MODEL)
    parser.add_argument("--frames", type=int, default=500)
    parser.add_argument("--method", choices=CALIBRATION_METHODS, default="entropy")
    parser.add_argument("--images", type=int, default=100, help="eval subset (sensitivity)")
    parser.add_argument("--int8-alone", choices=["head", "all"], default="head")
    parser.add_argument("--groups", default="", help="(sensitivity) only groups matching this")
    parser.add_argument(
        "--base-exclude",
        action="append",
        metavar="REGEX",
        help="(sensitivity) groups already kept in FP32, for a second, greedy pass",
    )
    parser.add_argument("--cache-dir", type=Path, default=Path("/tmp/vdet-cache"))
    parser.add_argument("--output", type=Path, required=True, help="JSON report")
    args = parser.parse_args(argv)
    if args.study == "markdown":  # --output names an accuracy JSON; its .md goes beside it
        text = accuracy_markdown(json.loads(args.output.read_text()))
        args.output.with_suffix(".md").write_text(text)
        print(text)
        return 0
    if args.calib is None:
        parser.error("--calib is required for sensitivity and accuracy")
    report = run_sensitivity(args) if args.study == "sensitivity" else run_accuracy(args)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
