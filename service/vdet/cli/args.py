"""What the commands share: the error a user can fix, the common options, progress lines."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from vdet.core import contract


class UsageError(Exception):
    """A problem with the command's input that the user can fix: one line, exit status 2."""


def add_input_shape_arg(p: argparse.ArgumentParser, both: bool = False) -> None:
    p.add_argument(
        "--input-shape",
        choices=("rect", "square", "both") if both else ("rect", "square"),
        default="rect",
        help="rect: the smallest input that holds the frame (where the backend allows); "
        "square: the model's input size" + ("; both: measure each, same run" if both else ""),
    )


def add_detection_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", type=Path, default=None, help="ONNX model (default: demo model)")
    p.add_argument("--backend", default="auto", help="auto, onnxruntime, torch, tensorrt")
    add_input_shape_arg(p)
    p.add_argument("--conf", type=float, default=contract.CONF_THRESHOLD, help="score threshold")
    p.add_argument("--iou", type=float, default=contract.IOU_THRESHOLD, help="NMS IoU threshold")
    p.add_argument("--max-det", type=int, default=contract.MAX_DET)
    p.add_argument("--classes", default=None, help="comma-separated class names or ids")


def progress(label: str) -> Callable[[int, int], None]:
    """A `done/total` line on stderr: rewritten in place on a terminal, every tenth in a log."""

    def report(done: int, total: int) -> None:
        if sys.stderr.isatty() or done == total or done % max(total // 10, 1) == 0:
            end = "\n" if done == total else "\r"
            print(f"{label}: {done}/{total}", end=end, file=sys.stderr, flush=True)

    return report
