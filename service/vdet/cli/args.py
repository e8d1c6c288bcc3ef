"""What the commands share: the error a user can fix, the common options, progress lines."""

from __future__ import annotations

import argparse
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

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
    """A `done/total` reporter: a tqdm bar on stderr when it is a terminal, nothing in logs and
    pipes (the command's result is what they get)."""
    bar: Any = None

    def report(done: int, total: int) -> None:
        nonlocal bar
        if not sys.stderr.isatty():
            return
        from tqdm import tqdm

        if bar is None:
            bar = tqdm(total=total, desc=label, file=sys.stderr, leave=True, **_screen())
        bar.update(done - bar.n)
        if done >= total:
            bar.close()

    return report


@contextmanager
def activity(label: str) -> Iterator[None]:
    """`label` and the time it has taken so far, on stderr while a step with no count of its
    own runs (an engine build, a calibration), when stderr is a terminal; silent otherwise."""
    if not sys.stderr.isatty():
        yield
        return
    from tqdm import tqdm

    stop = threading.Event()
    with tqdm(desc=label, file=sys.stderr, bar_format="{desc}: {elapsed}", **_screen()) as bar:

        def tick() -> None:
            while not stop.wait(1.0):
                bar.refresh()

        ticker = threading.Thread(target=tick, name="progress", daemon=True)
        ticker.start()
        try:
            yield
        finally:
            stop.set()
            ticker.join()


def _screen() -> dict[str, int]:
    """tqdm's ncols and nrows: the terminal's size, 80x24 where it says 0x0 (as a fresh
    pseudo-terminal does; tqdm then draws nothing at all)."""
    try:
        size = os.get_terminal_size(sys.stderr.fileno())
    except OSError:
        return {"ncols": 80, "nrows": 24}
    return {"ncols": size.columns or 80, "nrows": size.lines or 24}
