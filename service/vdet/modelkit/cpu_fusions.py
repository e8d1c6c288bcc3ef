"""Rewrites of a quantized YOLOv8 graph that change how ONNX Runtime's CPU provider runs it,
not what it computes (the demo model's outputs are bitwise equal before and after).

Two patterns of the exported graph cost the CPU build (`vdet quantize --target cpu`) more than
their arithmetic (ONNX Runtime's profiler, one thread, the demo model at 384x640: about 15% of
a frame between them; docs/quantization.md):

- SiLU. `x * sigmoid(x)` exports as a Sigmoid and a Mul that both read x. In a Q/DQ model x is
  a convolution's dequantized output, and ONNX Runtime gives each reader its own
  DequantizeLinear, so every SiLU is two dequantizations, a sigmoid and a multiply: four passes
  over the feature map, 27% of the frame, and a pattern its own fusions no longer see. Here it
  becomes one `com.microsoft` QuickGelu (`x * sigmoid(alpha * x)`, alpha 1: SiLU) behind one
  dequantization: one pass.
- The DFL expectation. The box head softmaxes each side's 16-bin distribution along axis 1 of
  [B, 16, 4, A] and takes its expectation with a 1x1 convolution whose weights are 0..15. A
  softmax off the last axis is run by transposing around it (3.6 ms of the frame). Here the
  transpose before it puts the bins last, [B, 4, A, 16], the softmax runs along them, and a
  MatMul with the bins [16, 1] replaces the convolution: [B, 4, A, 1], which the Reshape after
  it turns into the same [B, 4, A].

QuickGelu is an ONNX Runtime operator, so the result is a model for ONNX Runtime only (which
is what the CPU target is). Plain `onnx`: the CPU target needs nothing beyond the base install.
A graph without these patterns passes through unchanged.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper


@dataclass(frozen=True)
class CpuFusions:
    """What `fuse_for_onnxruntime_cpu` rewrote."""

    silu: int  # Sigmoid + Mul pairs now one QuickGelu
    dfl: int  # DFL softmax + convolution pairs now a last-axis softmax and a MatMul


def fuse_for_onnxruntime_cpu(model: onnx.ModelProto) -> tuple[onnx.ModelProto, CpuFusions]:
    """A copy of `model` with its SiLUs and its DFL expectation rewritten (module docstring)."""
    fused = onnx.ModelProto()
    fused.CopyFrom(model)
    graph = fused.graph
    silu = _fuse_silu(graph)
    # (Softmax along one axis is opset 13's; before it, every axis from `axis` on was one.)
    opset = next((o.version for o in fused.opset_import if o.domain in ("", "ai.onnx")), 0)
    dfl = _fuse_dfl(graph) if opset >= 13 else 0
    if silu and not any(o.domain == "com.microsoft" for o in fused.opset_import):
        fused.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return fused, CpuFusions(silu=silu, dfl=dfl)


def _readers(graph: onnx.GraphProto) -> dict[str, list[onnx.NodeProto]]:
    readers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in graph.node:
        for name in node.input:
            readers[name].append(node)
    return readers


def _fuse_silu(graph: onnx.GraphProto) -> int:
    readers = _readers(graph)
    outputs = {o.name for o in graph.output}
    replaced: dict[int, onnx.NodeProto] = {}  # id(Mul) -> its QuickGelu
    gone: set[int] = set()
    for sigmoid in graph.node:
        if sigmoid.op_type != "Sigmoid" or sigmoid.output[0] in outputs:
            continue
        x, gate = sigmoid.input[0], sigmoid.output[0]
        if len(readers[gate]) != 1:
            continue
        (mul,) = readers[gate]
        if mul.op_type != "Mul" or sorted(mul.input) != sorted([x, gate]):
            continue
        name = mul.name.removesuffix("/Mul") + "/SiLU" if mul.name else ""
        replaced[id(mul)] = helper.make_node(
            "QuickGelu", [x], [mul.output[0]], name=name, domain="com.microsoft", alpha=1.0
        )
        gone.add(id(sigmoid))
    nodes = [replaced.get(id(n), n) for n in graph.node if id(n) not in gone]
    del graph.node[:]
    graph.node.extend(nodes)
    return len(replaced)


def _fuse_dfl(graph: onnx.GraphProto) -> int:
    readers = _readers(graph)
    producers = {out: node for node in graph.node for out in node.output}
    initializers = {t.name: t for t in graph.initializer}
    changed_tensors: set[str] = set()
    replaced: dict[int, onnx.NodeProto] = {}  # id(Conv) -> its MatMul
    added: set[str] = set()  # the bins initializers written here
    for softmax in graph.node:
        if softmax.op_type != "Softmax" or _int_attribute(softmax, "axis") != 1:
            continue
        transpose = producers.get(softmax.input[0])
        if transpose is None or transpose.op_type != "Transpose":
            continue
        if _ints_attribute(transpose, "perm") != [0, 2, 1, 3]:
            continue
        if len(readers[transpose.output[0]]) != 1:
            continue
        if len(readers[softmax.output[0]]) != 1:
            continue
        (conv,) = readers[softmax.output[0]]
        if conv.op_type != "Conv" or len(conv.input) != 2:
            continue
        weight = initializers.get(conv.input[1])
        if weight is None:
            continue
        bins = numpy_helper.to_array(weight)
        if bins.ndim != 4 or bins.shape[0] != 1 or bins.shape[2:] != (1, 1):
            continue
        if not np.array_equal(bins.ravel(), np.arange(bins.shape[1], dtype=bins.dtype)):
            continue
        if _int_attribute(conv, "group", 1) != 1 or any(
            _ints_attribute(conv, key) not in ([], [1, 1]) for key in ("strides", "dilations")
        ):
            continue
        if _ints_attribute(conv, "pads") not in ([], [0, 0, 0, 0]):
            continue
        # [B, 1, 4, A] and [B, 4, A, 1] hold the same values in the same order; only readers
        # that look at it as flat data may follow: Reshapes to a constant shape that copies
        # no dimension but the batch (a 0 at index 0).
        if not all(_flat_reshape(r, conv.output[0], initializers) for r in readers[conv.output[0]]):
            continue
        bins_name = f"{conv.input[1]}/bins"
        if bins_name in initializers and bins_name not in added:
            continue  # the model has a tensor of that name already
        for attribute in transpose.attribute:
            if attribute.name == "perm":
                del attribute.ints[:]
                attribute.ints.extend([0, 1, 3, 2])
        for attribute in softmax.attribute:
            if attribute.name == "axis":
                attribute.i = -1
        if bins_name not in added:  # (two heads may share one weight)
            added.add(bins_name)
            graph.initializer.append(
                numpy_helper.from_array(
                    bins.reshape(bins.shape[1], 1).astype(np.float32), bins_name
                )
            )
        name = conv.name.removesuffix("/conv/Conv") + "/MatMul" if conv.name else ""
        replaced[id(conv)] = helper.make_node(
            "MatMul", [softmax.output[0], bins_name], [conv.output[0]], name=name
        )
        changed_tensors.update((transpose.output[0], softmax.output[0], conv.output[0]))
    if not replaced:
        return 0
    weights = {n.input[1] for n in graph.node if id(n) in replaced}
    nodes = [replaced.get(id(n), n) for n in graph.node]
    del graph.node[:]
    graph.node.extend(nodes)
    _drop_unread(graph, weights)
    # Shapes recorded for the tensors whose layout changed would now be wrong.
    kept = [v for v in graph.value_info if v.name not in changed_tensors]
    del graph.value_info[:]
    graph.value_info.extend(kept)
    return len(replaced)


def _flat_reshape(
    node: onnx.NodeProto, data: str, initializers: dict[str, onnx.TensorProto]
) -> bool:
    if node.op_type != "Reshape" or node.input[0] != data or len(node.input) < 2:
        return False
    shape = initializers.get(node.input[1])
    if shape is None or _int_attribute(node, "allowzero", 0):
        return False
    dims = numpy_helper.to_array(shape).tolist()
    return 0 not in dims[1:]


def _drop_unread(graph: onnx.GraphProto, names: set[str]) -> None:
    """Drop the initializers in `names` that no node reads any more."""
    read = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    kept = [t for t in graph.initializer if t.name not in names or t.name in read]
    del graph.initializer[:]
    graph.initializer.extend(kept)


def _int_attribute(node: onnx.NodeProto, name: str, default: int | None = None) -> int | None:
    for attribute in node.attribute:
        if attribute.name == name:
            return int(attribute.i)
    return default


def _ints_attribute(node: onnx.NodeProto, name: str) -> list[int]:
    for attribute in node.attribute:
        if attribute.name == name:
            return list(attribute.ints)
    return []
