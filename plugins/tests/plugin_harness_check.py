"""Run plugin_harness (built for a GPU or for the CPU emulator) and check it against the CPU
reference, writing one JSON report.

    python3 plugins/tests/plugin_harness_check.py --harness v10.8.0=/tmp/b/harness \\
        [--harness v11.1=/tmp/b/harness11] --work /tmp/w --json out.json [--cases full|quick]
        [--time-case dense_b1] [--time-iters 200]

For every harness binary: its self-checks (no arguments: creator, fields, getOutputDataTypes,
getOutputShapes with a dynamic batch, supportsFormatCombination, getWorkspaceSize,
configurePlugin, onShapeChange, the getFieldsToSerialize -> createPlugin round trip, enqueue on
a hand-computed head), then every case below through `--raw`, compared image by image with
`vdet.inference.postprocess.decode_and_nms_image`:

    counts                      exact
    classes                     exact
    scores, boxes (x1 y1 x2 y2) |got - expected| <= 1e-4 * max(|expected|, 1)
    rows after the last box     exactly zero

(the kernels round like the reference, docs/conventions.md, so the report also says whether
every value was bit-identical). The first harness also times enqueue on --time-case.

Exit status: 0 when everything passed, 1 on any mismatch or harness failure, 2 on a usage error.
Needs numpy and vdet: installed, or this checkout's with `PYTHONPATH=service` (its folder
service/vdet/ is the package).
The same comparison as tests/tensorrt/test_tensorrt_plugin_emulated.py, on more and larger cases.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

ROOT = Path(__file__).resolve().parents[2]
RTOL = 1e-4  # boxes and scores: |got - expected| <= RTOL * max(|expected|, 1)

FloatArray = npt.NDArray[np.float32]
Reference = Callable[[FloatArray, Any], tuple[Any, Any]]


def _import_reference() -> tuple[type, Reference]:
    """PostprocessParams and decode_and_nms_image (NumPy only: no OpenCV, no GPU packages)."""
    try:
        from vdet.inference.postprocess import PostprocessParams, decode_and_nms_image
    except ImportError as error:
        raise SystemExit(
            f"cannot import vdet ({error}): install it, or run with PYTHONPATH={ROOT / 'service'}"
        ) from error
    return PostprocessParams, decode_and_nms_image


# ---- cases --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    name: str
    kind: str  # clustered (emulated test's heads), sparse (realistic scores), dense (all pass)
    batch: int
    nc: int
    anchors: int
    half: bool = False
    agnostic: bool = False
    score: float = 0.25
    iou: float = 0.45
    top_k: int = 1000
    max_det: int = 300
    max_batch: int = 0  # the profile's max batch for getWorkspaceSize (0: the case's batch)
    seed: int = 7


def _boxes(rng: np.random.Generator, batch: int, anchors: int, clusters: int) -> FloatArray:
    """cx, cy, w, h [batch, anchors, 4]: jittered around a few centres, so NMS has work."""
    centres = rng.uniform(40, 600, size=(batch, clusters, 2))
    pick = rng.integers(0, clusters, size=(batch, anchors))
    cxcy = np.take_along_axis(centres, pick[..., None], axis=1)
    cxcy = cxcy + rng.normal(0, 6, (batch, anchors, 2))
    wh = rng.uniform(20, 90, size=(batch, anchors, 2))
    return np.concatenate([cxcy, wh], axis=2).astype(np.float32)


def make_head(case: Case) -> FloatArray:
    rng = np.random.default_rng(case.seed)
    b, nc, n = case.batch, case.nc, case.anchors
    if case.kind == "clustered":
        # tests/tensorrt/test_tensorrt_plugin_emulated.py's heads: distinct scores in (0, 1).
        boxes = _boxes(rng, b, n, 6)
        ranks = rng.permutation(b * nc * n).reshape(b, n, nc)
        scores = 0.001 + 0.998 * ranks / ranks.max()
    elif case.kind == "sparse":
        # What a detector emits: almost every score tiny, a few hundred anchors above 0.25.
        boxes = _boxes(rng, b, n, 40)
        logits = rng.normal(-9.0, 2.2, size=(b, n, nc))
        scores = 1.0 / (1.0 + np.exp(-logits))
    elif case.kind == "dense":
        # The worst case: every anchor passes the threshold in every class, so decode keeps all
        # N, top_k is full, the NMS mask is complete and max_det binds.
        boxes = _boxes(rng, b, n, 40)
        ranks = rng.permutation(b * nc * n).reshape(b, n, nc)
        scores = 0.3 + 0.69 * ranks / ranks.max()
    else:
        raise ValueError(case.kind)
    head = np.concatenate([boxes, scores.astype(np.float32)], axis=2).transpose(0, 2, 1)
    head = np.ascontiguousarray(head, dtype=np.float32)
    if case.half:  # the plugin reads IEEE half; feed values that half holds exactly
        head = head.astype(np.float16).astype(np.float32)
    return head


def cases(which: str) -> list[Case]:
    quick = [
        # The emulated test's three parameter sets.
        Case("clustered_b3_f32", "clustered", 3, 5, 300),
        Case("clustered_b3_f32_agnostic", "clustered", 3, 5, 300, agnostic=True, score=0.5,
             iou=0.3, top_k=100, max_det=20),
        Case("clustered_b3_f16", "clustered", 3, 5, 300, half=True, score=0.1, iou=0.6,
             top_k=64, max_det=7),
    ]  # fmt: skip
    full = [
        Case("sparse_b1", "sparse", 1, 80, 8400),
        Case("sparse_b4", "sparse", 4, 80, 8400),
        Case("sparse_b4_f16", "sparse", 4, 80, 8400, half=True),
        # Timed; its workspace is sized for a profile of max batch 4, as TensorRT would.
        Case("dense_b1", "dense", 1, 80, 8400, max_batch=4),
        Case("dense_b4", "dense", 4, 80, 8400),
        Case("dense_b4_f16", "dense", 4, 80, 8400, half=True),
        # top_k at its limit (64 mask words: the NMS scan's two-row-tile path on any GPU) and no
        # max_det cut, so the count is NMS's own (about 430 of 4096 per image).
        Case(
            "dense_b4_topk4096_agnostic",
            "dense",
            4,
            80,
            8400,
            agnostic=True,
            top_k=4096,
            max_det=4096,
        ),
    ]
    return quick if which == "quick" else quick + full


# ---- running and comparing ----------------------------------------------------------------------


def _run(command: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)


def _tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def compare(
    dets: FloatArray,
    counts: npt.NDArray[np.int32],
    expected: list[tuple[FloatArray, FloatArray, npt.NDArray[np.int32]]],
) -> dict[str, Any]:
    """One case's outputs against the reference; problems are listed, not raised."""
    problems: list[str] = []
    max_box_err = max_score_err = 0.0
    exact = True
    for b, (xyxy, scores, classes) in enumerate(expected):
        n = len(scores)
        if int(counts[b]) != n:
            problems.append(f"image {b}: count {int(counts[b])}, expected {n}")
            exact = False
            continue
        got = dets[b, :n]
        box_err = np.abs(got[:, :4] - xyxy)
        score_err = np.abs(got[:, 4] - scores)
        if n:
            max_box_err = max(max_box_err, float(box_err.max()))
            max_score_err = max(max_score_err, float(score_err.max()))
        exact &= bool(np.array_equal(got[:, :4], xyxy) and np.array_equal(got[:, 4], scores))
        bad_box = box_err > RTOL * np.maximum(np.abs(xyxy), 1.0)
        if bad_box.any():
            row = int(np.argwhere(bad_box)[0][0])
            problems.append(f"image {b} row {row}: box {got[row, :4]}, expected {xyxy[row]}")
        bad_score = score_err > RTOL * np.maximum(np.abs(scores), 1.0)
        if bad_score.any():
            row = int(np.argwhere(bad_score)[0][0])
            problems.append(f"image {b} row {row}: score {got[row, 4]}, expected {scores[row]}")
        if not np.array_equal(got[:, 5], classes.astype(np.float32)):
            row = int(np.argwhere(got[:, 5] != classes)[0][0])
            problems.append(f"image {b} row {row}: class {got[row, 5]}, expected {classes[row]}")
        if dets[b, n:].any():
            problems.append(f"image {b}: non-zero values after the last of {n} detections")
    return {
        "counts": [int(c) for c in counts],
        "expected_counts": [len(e[1]) for e in expected],
        "max_abs_box_err": max_box_err,
        "max_abs_score_err": max_score_err,
        "bit_identical": exact and not problems,
        "problems": problems[:10],
        "ok": not problems,
    }


def run_case(
    harness: Path, case: Case, work: Path, expected: list[Any], time_iters: int
) -> dict[str, Any]:
    folder = work / case.name
    folder.mkdir(parents=True, exist_ok=True)
    raw = make_head(case)
    raw.tofile(folder / "raw.f32")
    command = [
        str(harness), "--raw", str(folder / "raw.f32"),
        "--shape", f"{case.batch},{4 + case.nc},{case.anchors}",
        "--score", repr(case.score), "--iou", repr(case.iou), "--top-k", str(case.top_k),
        "--max-det", str(case.max_det), "--out", str(folder / "dets.f32"),
        "--count", str(folder / "count.i32"),
    ]  # fmt: skip
    if case.half:
        command.append("--half")
    if case.agnostic:
        command.append("--agnostic")
    if case.max_batch:
        command += ["--max-batch", str(case.max_batch)]
    report: dict[str, Any] = {"case": asdict(case), "command": " ".join(command)}
    if time_iters:
        command += ["--time", str(time_iters), "--timing", str(folder / "timing.json")]
    started = time.perf_counter()
    result = _run(command, timeout=300)
    report["seconds"] = round(time.perf_counter() - started, 3)
    if result.returncode != 0:
        report.update(ok=False, problems=[f"harness exit {result.returncode}"])
        report["stderr"] = _tail(result.stderr)
        return report
    dets = np.fromfile(folder / "dets.f32", np.float32).reshape(case.batch, case.max_det, 6)
    counts = np.fromfile(folder / "count.i32", np.int32)
    report.update(compare(dets, counts, expected))
    if time_iters:
        report["timing"] = json.loads((folder / "timing.json").read_text())
    return report


def reference(case: Case, params_type: type, decode: Reference) -> list[Any]:
    raw = make_head(case)
    params = params_type(
        conf_threshold=case.score,
        iou_threshold=case.iou,
        top_k=case.top_k,
        max_det=case.max_det,
        class_agnostic=case.agnostic,
    )
    out = []
    for b in range(case.batch):
        dets, _ = decode(raw[b], params)
        out.append((dets.xyxy, dets.scores, dets.class_ids))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--harness", action="append", required=True, metavar="LABEL=PATH")
    parser.add_argument("--work", type=Path, required=True, help="folder for inputs and outputs")
    parser.add_argument("--json", type=Path, required=True, help="the report")
    parser.add_argument("--cases", choices=("quick", "full"), default="full")
    parser.add_argument("--time-case", default="dense_b1", help="case timed on the first harness")
    parser.add_argument("--time-iters", type=int, default=200)
    parser.add_argument(
        "--note", action="append", default=[], metavar="KEY=VALUE", help="recorded as is"
    )
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        metavar="CASE",
        help="leave a case out (the CPU emulator has 48 KiB of shared memory, too little for "
        "dense_b4_topk4096_agnostic)",
    )
    args = parser.parse_args(argv)
    harnesses = []
    for item in args.harness:
        label, sep, path = item.partition("=")
        if not sep or not Path(path).is_file():
            parser.error(f"--harness {item}: want LABEL=PATH to an existing binary")
        harnesses.append((label, Path(path)))

    params_type, decode = _import_reference()
    chosen = [c for c in cases(args.cases) if c.name not in args.skip]
    started = time.perf_counter()
    expected = {c.name: reference(c, params_type, decode) for c in chosen}
    report: dict[str, Any] = {
        "tolerance": f"counts, classes exact; boxes, scores |d| <= {RTOL} * max(|expected|, 1)",
        "environment": dict(note.partition("=")[::2] for note in args.note),
        "reference_seconds": round(time.perf_counter() - started, 3),
        "harnesses": {},
    }
    ok = True
    for index, (label, harness) in enumerate(harnesses):
        entry: dict[str, Any] = {"binary": str(harness)}
        checks = _run([str(harness)], timeout=120)
        entry["self_checks"] = {
            "ok": checks.returncode == 0 and "all checks passed" in checks.stdout,
            "exit": checks.returncode,
            "stdout": _tail(checks.stdout, 3),
            "failures": [line for line in checks.stderr.splitlines() if line.startswith("FAIL")],
        }
        if not entry["self_checks"]["ok"]:
            entry["self_checks"]["stderr"] = _tail(checks.stderr, 10)
        ok &= entry["self_checks"]["ok"]
        entry["cases"] = []
        for case in chosen:
            iters = args.time_iters if index == 0 and case.name == args.time_case else 0
            result = run_case(harness, case, args.work / label, expected[case.name], iters)
            entry["cases"].append(result)
            ok &= result["ok"]
            if result["ok"]:
                status, extra = "ok", ""
            else:
                status = "ERROR" if "stderr" in result else "MISMATCH"
                extra = "  " + "; ".join(result["problems"] + [result.get("stderr", "")])[:300]
            print(f"[{label}] {case.name:28s} {status} counts={result.get('counts')}{extra}")
            if "timing" in result:
                print(f"[{label}] {case.name} enqueue: {json.dumps(result['timing'])}")
        report["harnesses"][label] = entry
        if entry["self_checks"]["ok"]:
            print(f"[{label}] self-checks ok: {entry['self_checks']['stdout']}")
        else:
            details = entry["self_checks"]["failures"][:5] or [entry["self_checks"]["stderr"]]
            print(f"[{label}] self-checks FAILED (exit {checks.returncode}): {details}")
    report["ok"] = ok
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"plugin harness check: {'PASSED' if ok else 'FAILED'} -> {args.json}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
