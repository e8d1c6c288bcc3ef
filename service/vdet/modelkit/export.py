"""Ultralytics YOLOv8 checkpoint (.pt or model .yaml) -> ONNX with the raw detection head.

The ONNX that vdet serves keeps Ultralytics' raw head `[B, 4 + nc, N]` (cx, cy, w, h in input
pixels, then per-class sigmoid scores) and carries the class names in its metadata: decoding and
NMS are ours (NumPy on the CPU, the fused CUDA kernel / TensorRT plugin on the GPU), so the export
must not add Ultralytics' own NMS (`nms=False`, no end2end head).

Ultralytics (AGPL-3.0) and PyTorch are an optional extra (`scripts/setup.sh --extras train`):
serving never imports them.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from vdet.core.contract import INPUT_SIZE
from vdet.core.extras import needs_extra

if TYPE_CHECKING:
    from vdet.core.model import ModelInfo

SUPPORTED_TASK = "detect"


class ExportError(RuntimeError):
    """The checkpoint cannot be exported to an ONNX that vdet serves."""


def export_onnx(
    weights: str | Path,
    output: Path,
    imgsz: int = INPUT_SIZE,
    dynamic_batch: bool = False,
    batch: int = 1,
    opset: int = 17,
    simplify: bool = True,
) -> ModelInfo:
    """Export `weights` to `output` and return the checked model description.

    `weights` is a trained `.pt` or an Ultralytics model `.yaml` (random weights, for tests).
    Static batch `batch` unless `dynamic_batch`, in which case the batch axis is symbolic.
    """
    os.environ.setdefault("YOLO_OFFLINE", "1")  # never reach for a hub
    try:
        from ultralytics import YOLO  # type: ignore[attr-defined]
    except ImportError as exc:  # pragma: no cover - depends on the optional extra
        raise ExportError(needs_extra("exporting", "train")) from exc
    if opset < 17:
        raise ExportError(f"opset {opset} is too old: vdet needs opset 17 or newer")
    weights = Path(weights)
    if not weights.exists() and weights.suffix != ".yaml":
        raise ExportError(f"no such checkpoint: {weights}")
    try:
        model = YOLO(str(weights), task=SUPPORTED_TASK)
    except Exception as exc:
        raise ExportError(f"cannot load {weights} as an Ultralytics model: {exc}") from exc
    task = getattr(model, "task", None)
    if task != SUPPORTED_TASK:
        raise ExportError(f"{weights} is a '{task}' model; vdet serves detection models only")
    layers = getattr(model.model, "model", None)
    head = layers[-1] if layers is not None else None
    if head is None or type(head).__name__ != "Detect":
        raise ExportError(
            f"{weights} has head {type(head).__name__}; vdet supports the YOLOv8 'Detect' head "
            "(anchor-free, raw [B, 4+nc, N] output)"
        )
    if getattr(head, "end2end", False):
        raise ExportError(f"{weights} has an end-to-end (NMS-free) head, which vdet does not serve")
    written = model.export(
        format="onnx",
        imgsz=imgsz,
        dynamic=dynamic_batch,
        batch=batch,
        opset=opset,
        simplify=simplify,
        nms=False,
        half=False,
        device="cpu",
    )
    output.parent.mkdir(parents=True, exist_ok=True)
    if Path(written).resolve() != output.resolve():
        shutil.move(written, output)
    from vdet.core.model import load_model_info

    info = load_model_info(output)
    expected = len(model.names)
    if info.num_classes != expected:
        raise ExportError(
            f"exported head has {info.num_classes} classes, the checkpoint names {expected}"
        )
    return info
