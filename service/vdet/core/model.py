"""What a detection model file promises: class names, input size, batch, output layout.

This module owns reading and validating a model file's *signature* (inputs, outputs, metadata)
before any backend loads it, so that an unsupported export fails at startup with a message that
says what to change, not deep inside inference with a shape error. It must not run the model.

Only ONNX is read here. Ultralytics exports store their metadata as string `metadata_props`:
`names` (a Python dict literal such as "{0: 'person', 1: 'car'}"), `imgsz` ("[640, 640]"),
`stride`, `batch`, `task` and `end2end`. Other exporters are accepted when the graph shapes alone
determine the input size and class count; classes are then named by their index.

The supported output is the raw YOLOv8-style head: exactly one tensor [B, 4 + nc, N] whose rows
0..3 are cx, cy, w, h in input pixels and rows 4.. are per-class scores (already sigmoid'ed).
"""

from __future__ import annotations

import ast
import hashlib
from dataclasses import dataclass
from os import PathLike
from pathlib import Path

import onnx

from vdet.core.contract import STRIDE

# A dimension as the graph declares it: a fixed size, a symbolic name, or nothing at all.
Dim = int | str | None


class ModelError(ValueError):
    """The model file exists but is not a detection model this pipeline can run."""


@dataclass(frozen=True)
class ModelInfo:
    """The validated signature of one detection model file.

    `batch` is the fixed batch size the graph was exported with, or None when it is dynamic.
    `input_hw` is the (height, width) the network expects; letterbox to exactly this size.
    `num_anchors` is N of the [B, 4 + nc, N] output when the graph fixes it, else None.
    `dynamic_hw`: the graph leaves height and width open, so it also runs on smaller inputs
    whose sides are multiples of `stride` (rectangular letterboxes, see `rect_input_hw`).
    """

    path: Path
    names: tuple[str, ...]
    input_hw: tuple[int, int]
    num_classes: int
    batch: int | None
    sha256: str
    stride: int = STRIDE
    num_anchors: int | None = None
    dynamic_hw: bool = False

    def __post_init__(self) -> None:
        if self.num_classes != len(self.names):
            raise ValueError(
                f"num_classes ({self.num_classes}) must equal len(names) ({len(self.names)})"
            )
        if self.num_classes < 1:
            raise ValueError("a detection model needs at least one class")
        if len(self.input_hw) != 2 or min(self.input_hw) < 1:
            raise ValueError(f"input_hw must be two positive ints, got {self.input_hw}")
        if self.batch is not None and self.batch < 1:
            raise ValueError(f"batch must be positive or None (dynamic), got {self.batch}")


def file_sha256(path: str | PathLike[str]) -> str:
    """Hex SHA-256 of a file, read in chunks so large engines do not load into memory."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def load_model_info(path: str | PathLike[str]) -> ModelInfo:
    """Read and validate an ONNX detection model's signature; raise ModelError if unsupported."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"model file not found: {path}")
    try:
        # Weights may live in external files; only the graph's signature is needed here.
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # onnx raises several unrelated types for a corrupt file
        raise ModelError(f"{path}: not a readable ONNX model ({exc})") from exc

    where = str(path)
    metadata = {prop.key: prop.value for prop in model.metadata_props}
    _check_model_kind(metadata, where)
    input_dims = _single_input_dims(model.graph, where)
    output_dims = _single_output_dims(model.graph, where)

    batch = input_dims[0] if isinstance(input_dims[0], int) else None
    names = _names_from_metadata(metadata, where)
    names = _check_output(output_dims, names, where)
    input_hw = _input_hw(input_dims, metadata, where)
    stride = _int_metadata(metadata, "stride", where) or STRIDE
    num_anchors = output_dims[2] if isinstance(output_dims[2], int) else None

    return ModelInfo(
        path=path,
        names=names,
        input_hw=input_hw,
        num_classes=len(names),
        batch=batch,
        sha256=file_sha256(path),
        stride=stride,
        num_anchors=num_anchors,
        dynamic_hw=not isinstance(input_dims[2], int) and not isinstance(input_dims[3], int),
    )


def _check_model_kind(metadata: dict[str, str], where: str) -> None:
    """Reject what the metadata says is not a plain 3-channel detection head."""
    task = metadata.get("task")
    if task is not None and task != "detect":
        raise ModelError(f"{where}: task is {task!r}; vdet serves object detection ('detect') only")
    if metadata.get("end2end", "False").strip() == "True":
        raise ModelError(
            f"{where}: end-to-end export (NMS or an NMS-free head inside the graph); vdet runs its "
            "own NMS and needs the raw head [B, 4+nc, N]. Re-export without NMS."
        )
    channels = metadata.get("channels")
    if channels is not None and channels.strip() != "3":
        raise ModelError(f"{where}: model expects {channels} channels; only 3-channel images")


def _value_dims(value: onnx.ValueInfoProto) -> tuple[Dim, ...]:
    """The declared shape of a graph input or output: ints where fixed, names where symbolic.

    Some exporters write 0 for an unknown size; that is treated as unknown (None), not as 0.
    """
    tensor_type = value.type.tensor_type
    if not tensor_type.HasField("shape"):
        return ()
    dims: list[Dim] = []
    for dim in tensor_type.shape.dim:
        if dim.HasField("dim_value") and dim.dim_value > 0:
            dims.append(int(dim.dim_value))
        elif dim.HasField("dim_param"):
            dims.append(str(dim.dim_param))
        else:
            dims.append(None)
    return tuple(dims)


_FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)


def _single_input_dims(graph: onnx.GraphProto, where: str) -> tuple[Dim, ...]:
    # Old IR versions list initializers (weights) among the inputs; they are not fed by callers.
    weights = {init.name for init in graph.initializer}
    inputs = [value for value in graph.input if value.name not in weights]
    if len(inputs) != 1:
        raise ModelError(
            f"{where}: expected exactly one input (images NCHW), got {len(inputs)}: "
            f"{[value.name for value in inputs]}"
        )
    value = inputs[0]
    if value.type.tensor_type.elem_type not in _FLOAT_TYPES:
        raise ModelError(f"{where}: input {value.name!r} must be float32 or float16")
    dims = _value_dims(value)
    if len(dims) != 4:
        raise ModelError(
            f"{where}: input {value.name!r} must be NCHW with rank 4, got shape {list(dims)}"
        )
    if dims[1] != 3 and isinstance(dims[1], int):
        hint = " (looks like NHWC; export NCHW)" if dims[3] == 3 else ""
        raise ModelError(
            f"{where}: input {value.name!r} must be NCHW with 3 channels, "
            f"got shape {list(dims)}{hint}"
        )
    return dims


def _single_output_dims(graph: onnx.GraphProto, where: str) -> tuple[Dim, ...]:
    outputs = list(graph.output)
    if len(outputs) != 1:
        raise ModelError(
            f"{where}: expected exactly one output [B, 4+nc, N], got {len(outputs)} "
            f"({[value.name for value in outputs]}); segmentation/pose heads and exports with "
            "NMS inside the graph are not supported"
        )
    value = outputs[0]
    if value.type.tensor_type.elem_type not in _FLOAT_TYPES:
        raise ModelError(f"{where}: output {value.name!r} must be float32 or float16")
    dims = _value_dims(value)
    if len(dims) != 3:
        raise ModelError(
            f"{where}: output {value.name!r} must be [B, 4+nc, N] (rank 3), got {list(dims)}"
        )
    return dims


def _check_output(
    dims: tuple[Dim, ...], names: tuple[str, ...] | None, where: str
) -> tuple[str, ...]:
    """Check the output's channel count against the names; return the names to use."""
    channels, anchors = dims[1], dims[2]
    if names is None:
        if not isinstance(channels, int):
            raise ModelError(
                f"{where}: no 'names' metadata and the output's class dimension is symbolic "
                f"({list(dims)}); cannot tell the number of classes"
            )
        if channels < 5:
            raise ModelError(f"{where}: output {list(dims)} has no class rows (needs 4 + nc)")
        # Without names the class count comes from the graph; name classes by their index.
        return tuple(str(i) for i in range(channels - 4))
    expected = 4 + len(names)
    if isinstance(channels, int) and channels != expected:
        if anchors == expected:
            raise ModelError(
                f"{where}: output is {list(dims)}, anchors first; vdet expects "
                f"[B, 4+nc, N] = [B, {expected}, N] (the Ultralytics layout)"
            )
        raise ModelError(
            f"{where}: output has {channels} rows but 4 + {len(names)} classes = {expected} "
            f"were expected (shape {list(dims)}); names metadata and head disagree"
        )
    return names


def _input_hw(dims: tuple[Dim, ...], metadata: dict[str, str], where: str) -> tuple[int, int]:
    graph_h, graph_w = dims[2], dims[3]
    meta_hw = _imgsz_from_metadata(metadata, where)
    if isinstance(graph_h, int) and isinstance(graph_w, int):
        if meta_hw is not None and meta_hw != (graph_h, graph_w):
            raise ModelError(
                f"{where}: metadata imgsz {list(meta_hw)} disagrees with the graph input "
                f"{list(dims)}"
            )
        return graph_h, graph_w
    if meta_hw is None:
        raise ModelError(
            f"{where}: input height/width are dynamic ({list(dims)}) and there is no 'imgsz' "
            "metadata; cannot tell the input size"
        )
    return meta_hw


def _literal(metadata: dict[str, str], key: str, where: str) -> object:
    try:
        return ast.literal_eval(metadata[key])
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as exc:
        raise ModelError(f"{where}: metadata {key!r} is not a Python literal: {exc}") from exc


def _names_from_metadata(metadata: dict[str, str], where: str) -> tuple[str, ...] | None:
    if "names" not in metadata:
        return None
    parsed = _literal(metadata, "names", where)
    if isinstance(parsed, list | tuple):
        parsed = dict(enumerate(parsed))
    if not isinstance(parsed, dict) or not parsed:
        raise ModelError(f"{where}: metadata 'names' must be a non-empty dict {{id: name}}")
    keys = list(parsed)
    if not all(isinstance(k, int) and not isinstance(k, bool) for k in keys) or sorted(
        keys
    ) != list(range(len(keys))):
        raise ModelError(f"{where}: metadata 'names' ids must be 0..{len(keys) - 1}, got {keys}")
    return tuple(str(parsed[i]) for i in range(len(keys)))


def _imgsz_from_metadata(metadata: dict[str, str], where: str) -> tuple[int, int] | None:
    if "imgsz" not in metadata:
        return None
    parsed = _literal(metadata, "imgsz", where)
    if isinstance(parsed, int):
        parsed = [parsed, parsed]
    if (
        not isinstance(parsed, list | tuple)
        or len(parsed) != 2
        or not all(isinstance(v, int) and v > 0 for v in parsed)
    ):
        raise ModelError(f"{where}: metadata 'imgsz' must be [height, width], got {parsed!r}")
    return int(parsed[0]), int(parsed[1])


def _int_metadata(metadata: dict[str, str], key: str, where: str) -> int | None:
    if key not in metadata:
        return None
    parsed = _literal(metadata, key, where)
    if not isinstance(parsed, int) or isinstance(parsed, bool) or parsed < 1:
        raise ModelError(f"{where}: metadata {key!r} must be a positive int, got {parsed!r}")
    return parsed
