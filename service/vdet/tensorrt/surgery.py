"""ONNX surgery: put vdet's decode + NMS plugin node after the raw YOLOv8 head.

This module owns rewriting a raw-head ONNX (`[B, 4 + nc, N]`, see `vdet.core.model`) into
the end-to-end graph that `vdet engine build --plugin-nms` hands to TensorRT: the head stays an
internal tensor and feeds one `VdetDecodeNms` node, whose outputs replace it as the graph's
outputs:

    detections      [B, max_det, 6] float32  x1, y1, x2, y2, score, class (input pixels);
                                              rows after the last kept box are zero
    num_detections  [B]             int32    kept boxes per image

TensorRT's ONNX parser imports a node whose op it does not know through the plugin registry:
the op type is the plugin name, and the string attributes `plugin_version` and
`plugin_namespace` select the creator (onnx-tensorrt's FallbackPluginImporter). Every other
attribute whose name the creator lists becomes a PluginField (ONNX INT -> kINT32, FLOAT ->
kFLOAT32). The plugin (C++, plugins/ of the repository) must agree with the names and types
here.

The decode and NMS rules are docs/conventions.md's. What the plugin cannot do: a class filter
(it is per stream; apply it to the plugin's output) and per-stream thresholds other than the
ones baked in here (a stricter score threshold can be applied afterwards; another IoU threshold
cannot, since greedy NMS does not compose).

It must not build engines (engines/build.py) or run anything on a GPU; onnx-graphsurgeon (the
`tensorrt` extra) is imported only when a graph is rewritten.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import onnx

from vdet.core import contract
from vdet.core.contract import MAX_TOP_K
from vdet.core.model import Dim, ModelError, load_model_info

if TYPE_CHECKING:
    from vdet.core.contract import PostprocessParams

PLUGIN_OP = "VdetDecodeNms"
PLUGIN_NAMESPACE = "vdet"
PLUGIN_VERSION = "1"
# ONNX domain of the node; TensorRT finds the plugin by op type, version and namespace only.
PLUGIN_DOMAIN = "vdet"
PLUGIN_DOMAIN_VERSION = 1
PLUGIN_NODE_NAME = "vdet/decode_nms"
DETECTIONS = "detections"
NUM_DETECTIONS = "num_detections"
DETECTION_FIELDS = 6  # x1, y1, x2, y2, score, class
METADATA_KEY = "vdet_decode_nms"


class SurgeryError(ValueError):
    """The model cannot take the plugin node; the message says why."""


@dataclass(frozen=True)
class DecodeNmsAttributes:
    """The plugin node's attributes: `PostprocessParams` without a class filter.

    Thresholds are stored as ONNX FLOAT (float32), which is also what the CPU reference rounds
    them to before comparing. Defaults are vdet.core.contract's, as are the plugin's own (C++) ones.
    """

    score_threshold: float = contract.CONF_THRESHOLD
    iou_threshold: float = contract.IOU_THRESHOLD
    top_k: int = contract.TOP_K
    max_det: int = contract.MAX_DET
    class_agnostic: bool = contract.CLASS_AGNOSTIC

    def __post_init__(self) -> None:
        for name in ("score_threshold", "iou_threshold"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise SurgeryError(f"{name} must be a number in [0, 1], got {value!r}")
            if not 0.0 <= value <= 1.0:
                raise SurgeryError(f"{name} must be in [0, 1], got {value}")
        for name in ("top_k", "max_det"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise SurgeryError(f"{name} must be a positive int, got {value!r}")
        if self.top_k > MAX_TOP_K:
            raise SurgeryError(f"top_k {self.top_k} exceeds the plugin's limit of {MAX_TOP_K}")
        if not isinstance(self.class_agnostic, bool):
            raise SurgeryError(f"class_agnostic must be a bool, got {self.class_agnostic!r}")

    @classmethod
    def from_params(cls, params: PostprocessParams) -> DecodeNmsAttributes:
        """The plugin equivalent of CPU postprocess parameters; a class filter is refused."""
        if params.classes is not None:
            raise SurgeryError(
                "the decode + NMS plugin has no class filter (it is per stream); filter its "
                "output by class instead"
            )
        return cls(
            score_threshold=params.conf_threshold,
            iou_threshold=params.iou_threshold,
            top_k=params.top_k,
            max_det=params.max_det,
            class_agnostic=params.class_agnostic,
        )

    def onnx_attributes(self) -> dict[str, float | int | str]:
        """Node attributes: the plugin's fields plus the parser's plugin selectors."""
        return {
            "score_threshold": float(self.score_threshold),
            "iou_threshold": float(self.iou_threshold),
            "top_k": int(self.top_k),
            "max_det": int(self.max_det),
            "class_agnostic": int(self.class_agnostic),
            "plugin_version": PLUGIN_VERSION,
            "plugin_namespace": PLUGIN_NAMESPACE,
        }


@dataclass(frozen=True)
class SurgeryResult:
    """What `add_decode_nms_file` wrote: the raw head it consumed and the new outputs' shapes."""

    output: Path
    head_name: str
    head_shape: tuple[Dim, ...]
    detections_shape: tuple[Dim, ...]
    num_detections_shape: tuple[Dim, ...]
    attributes: DecodeNmsAttributes


def add_decode_nms(model: onnx.ModelProto, attributes: DecodeNmsAttributes) -> onnx.ModelProto:
    """Return a copy of a raw-head model whose outputs come from a `VdetDecodeNms` node.

    The head must be the single output `[B, 4 + nc, N]` (float32 or float16); B, nc and N may
    be symbolic. The model's metadata is kept, with the plugin's attributes added under
    `vdet_decode_nms` so that a reader of the file knows what was baked in.
    """
    import numpy as np
    import onnx_graphsurgeon as gs

    if any(node.op_type == PLUGIN_OP for node in model.graph.node):
        raise SurgeryError(f"the model already has a {PLUGIN_OP} node")
    if len(model.graph.output) != 1:
        raise SurgeryError(
            f"expected one raw-head output [B, 4+nc, N], got {len(model.graph.output)}: "
            f"{[o.name for o in model.graph.output]}"
        )
    head_dims = _dims(model.graph.output[0])
    if len(head_dims) != 3:
        raise SurgeryError(f"the head must have rank 3 [B, 4+nc, N], got {list(head_dims)}")
    rows = head_dims[1]
    if isinstance(rows, int) and rows < 5:
        raise SurgeryError(f"the head has {rows} rows; it needs 4 box rows and >= 1 class")

    graph = gs.import_onnx(model)
    head = graph.outputs[0]
    if head.dtype not in (np.float32, np.float16):
        raise SurgeryError(f"the head must be float32 or float16, got {head.dtype}")
    batch = head_dims[0] if head_dims[0] is not None else "batch"
    detections = gs.Variable(
        DETECTIONS, dtype=np.float32, shape=[batch, attributes.max_det, DETECTION_FIELDS]
    )
    num_detections = gs.Variable(NUM_DETECTIONS, dtype=np.int32, shape=[batch])
    node = gs.Node(
        op=PLUGIN_OP,
        name=PLUGIN_NODE_NAME,
        domain=PLUGIN_DOMAIN,
        attrs=dict(attributes.onnx_attributes()),
        inputs=[head],
        outputs=[detections, num_detections],
    )
    graph.nodes.append(node)
    graph.outputs = [detections, num_detections]
    graph.cleanup().toposort()

    opsets = [onnx.helper.make_opsetid(o.domain, o.version) for o in model.opset_import]
    if all(o.domain != PLUGIN_DOMAIN for o in opsets):
        opsets.append(onnx.helper.make_opsetid(PLUGIN_DOMAIN, PLUGIN_DOMAIN_VERSION))
    result: onnx.ModelProto = gs.export_onnx(graph, opset_imports=opsets)
    result.ir_version = model.ir_version
    result.producer_name = model.producer_name
    result.producer_version = model.producer_version
    result.doc_string = model.doc_string
    for prop in model.metadata_props:
        if prop.key != METADATA_KEY:
            result.metadata_props.add(key=prop.key, value=prop.value)
    result.metadata_props.add(key=METADATA_KEY, value=json.dumps(asdict(attributes)))
    return result


def add_decode_nms_file(
    source: str | os.PathLike[str],
    output: str | os.PathLike[str],
    attributes: DecodeNmsAttributes,
) -> SurgeryResult:
    """Validate `source` as a vdet model, rewrite it with the plugin node, write `output`."""
    source, output = Path(source), Path(output)
    try:
        load_model_info(source)  # the same signature checks every backend applies
    except ModelError as exc:
        raise SurgeryError(str(exc)) from exc
    model = onnx.load(str(source))
    head = model.graph.output[0]
    rewritten = add_decode_nms(model, attributes)
    check_plugin_model(rewritten)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(output.name + ".tmp")
    onnx.save(rewritten, str(tmp))
    tmp.replace(output)
    dets, nums = rewritten.graph.output
    return SurgeryResult(
        output=output,
        head_name=head.name,
        head_shape=_dims(head),
        detections_shape=_dims(dets),
        num_detections_shape=_dims(nums),
        attributes=attributes,
    )


def plugin_node(model: onnx.ModelProto) -> onnx.NodeProto | None:
    """The model's `VdetDecodeNms` node, or None when it has none."""
    nodes = [node for node in model.graph.node if node.op_type == PLUGIN_OP]
    if len(nodes) > 1:
        raise SurgeryError(f"the model has {len(nodes)} {PLUGIN_OP} nodes; expected one")
    return nodes[0] if nodes else None


def has_plugin_node(path: str | os.PathLike[str]) -> bool:
    """Whether an ONNX file needs vdet's plugin library to be parsed by TensorRT."""
    model = onnx.load(str(path), load_external_data=False)
    return plugin_node(model) is not None


def check_plugin_model(model: onnx.ModelProto) -> None:
    """Check a rewritten model: ONNX's checker (our domain is a custom one), node and outputs.

    ONNX has no schema for `vdet.VdetDecodeNms`, so its checker verifies the rest of the graph
    and only that the node's domain is imported; the node itself is checked here.
    """
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        raise SurgeryError(f"ONNX checker: {exc}") from exc
    node = plugin_node(model)
    if node is None:
        raise SurgeryError(f"the model has no {PLUGIN_OP} node")
    if node.domain != PLUGIN_DOMAIN:
        raise SurgeryError(f"{PLUGIN_OP} must be in domain {PLUGIN_DOMAIN!r}, not {node.domain!r}")
    if not any(o.domain == PLUGIN_DOMAIN for o in model.opset_import):
        raise SurgeryError(f"the model does not import the {PLUGIN_DOMAIN!r} domain")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    expected = {
        "score_threshold": onnx.AttributeProto.FLOAT,
        "iou_threshold": onnx.AttributeProto.FLOAT,
        "top_k": onnx.AttributeProto.INT,
        "max_det": onnx.AttributeProto.INT,
        "class_agnostic": onnx.AttributeProto.INT,
        "plugin_version": onnx.AttributeProto.STRING,
        "plugin_namespace": onnx.AttributeProto.STRING,
    }
    types = {a.name: a.type for a in node.attribute}
    if types != expected:
        raise SurgeryError(f"{PLUGIN_OP} attributes are {types}, expected {expected}")
    if attrs["plugin_version"] != PLUGIN_VERSION.encode():
        raise SurgeryError(f"plugin_version is {attrs['plugin_version']!r}")
    if attrs["plugin_namespace"] != PLUGIN_NAMESPACE.encode():
        raise SurgeryError(f"plugin_namespace is {attrs['plugin_namespace']!r}")
    if len(node.input) != 1 or list(node.output) != [DETECTIONS, NUM_DETECTIONS]:
        raise SurgeryError(
            f"{PLUGIN_OP} must map one input to ({DETECTIONS}, {NUM_DETECTIONS}), got "
            f"{list(node.input)} -> {list(node.output)}"
        )
    outputs = {o.name: o for o in model.graph.output}
    if set(outputs) != {DETECTIONS, NUM_DETECTIONS}:
        raise SurgeryError(f"graph outputs are {sorted(outputs)}")
    dets, nums = outputs[DETECTIONS], outputs[NUM_DETECTIONS]
    if dets.type.tensor_type.elem_type != onnx.TensorProto.FLOAT:
        raise SurgeryError(f"{DETECTIONS} must be float32")
    if nums.type.tensor_type.elem_type != onnx.TensorProto.INT32:
        raise SurgeryError(f"{NUM_DETECTIONS} must be int32")
    det_dims, num_dims = _dims(dets), _dims(nums)
    if len(det_dims) != 3 or det_dims[1:] != (attrs["max_det"], DETECTION_FIELDS):
        raise SurgeryError(f"{DETECTIONS} must be [B, {attrs['max_det']}, 6], got {det_dims}")
    if len(num_dims) != 1 or num_dims[0] != det_dims[0]:
        raise SurgeryError(f"{NUM_DETECTIONS} must be [B] like {DETECTIONS}, got {num_dims}")


def head_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """The graph up to the plugin's input: the raw-head model that the surgery started from.

    Used to check that the surgery left the network itself untouched (it runs in ONNX Runtime)
    and to debug an end-to-end engine against the CPU reference.
    """
    import onnx_graphsurgeon as gs

    node = plugin_node(model)
    if node is None:
        raise SurgeryError(f"the model has no {PLUGIN_OP} node")
    graph = gs.import_onnx(model)
    head = graph.tensors()[node.input[0]]
    graph.outputs = [head]
    graph.cleanup(remove_unused_graph_inputs=False).toposort()
    opsets = [
        onnx.helper.make_opsetid(o.domain, o.version)
        for o in model.opset_import
        if o.domain != PLUGIN_DOMAIN
    ]
    result: onnx.ModelProto = gs.export_onnx(graph, opset_imports=opsets)
    result.ir_version = model.ir_version
    for prop in model.metadata_props:
        if prop.key != METADATA_KEY:
            result.metadata_props.add(key=prop.key, value=prop.value)
    return result


def _dims(value: onnx.ValueInfoProto) -> tuple[Dim, ...]:
    dims: list[Dim] = []
    for dim in value.type.tensor_type.shape.dim:
        if dim.HasField("dim_value"):
            dims.append(int(dim.dim_value))
        elif dim.HasField("dim_param"):
            dims.append(str(dim.dim_param))
        else:
            dims.append(None)
    return tuple(dims)
