"""Export pass: a grouped Conv over one spatial axis becomes the same Conv over two axes, the first of size 1.

ORT 1.19.2's CPU gradient of Conv (`ConvGrad`, orttraining/training_ops/cpu/nn/conv_grad.cc) computes dX group by
group. For a kernel of two spatial axes it folds each group's columns back with `Col2im` over C / group channels;
for any other rank it calls `Col2imNd` with an image size of C * input_image_size, the size of the whole dX, while
writing at the group's offset in dX. `Col2imNd` first zero-fills that many elements, so every group after the first
zeroes memory past the end of dX: (group - 1) / group of dX's size, for a depthwise Conv almost all of it. dX's own
values come out right (each later group rewrites its part after the earlier one zeroed it), so the damage shows
elsewhere and depends on what lies after dX: other tensors of ORT's arena zeroed (losses off native's in some
processes), ORT's arena or glibc's heap bookkeeping destroyed (`BFCArena::FreeAndMaybeCoalesce`,
`free(): corrupted unsorted chunks`, segmentation faults), in a pattern that changes with PYTHONHASHSEED. The
depthwise causal convolution of the linear-attention types (Qwen3.5, Qwen3-Next, Kimi Linear, ...) is such a Conv.

The pass rewrites every grouped Conv with a one-axis kernel as Unsqueeze(axis 2) -> Conv with kernel (1, k) ->
Squeeze(axis 2), input and weight unsqueezed alike: the same values, and ORT differentiates it on its two-axis path.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .base import ExportedGraph, GraphPass
from .contract import Edit

logger = logging.getLogger(__name__)

# attribute -> the value of the added leading spatial axis (pads hold begins then ends)
_SPATIAL_ATTRIBUTES = {"kernel_shape": 1, "strides": 1, "dilations": 1}


@dataclass
class WidenedConvs:
    widened: list[str]

    def log(self) -> None:
        if self.widened:
            logger.info(
                "ort_zero: %d grouped one-axis Convs run as two-axis Convs (ORT's ConvGrad overruns dX on them)",
                len(self.widened),
            )


def _ints(node: onnx.NodeProto, name: str) -> list[int] | None:
    return next((list(a.ints) for a in node.attribute if a.name == name), None)


def _group(node: onnx.NodeProto) -> int:
    return next((a.i for a in node.attribute if a.name == "group"), 1)


def one_axis_grouped_convs(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The Convs with group > 1 whose kernel has one spatial axis (torch's exporter always writes kernel_shape)."""
    return [
        node
        for node in graph.node
        if node.op_type == "Conv"
        and node.domain in ("", "ai.onnx")
        and _group(node) > 1
        and len(_ints(node, "kernel_shape") or []) == 1
    ]


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)


def _axis_op(op_type: str, value: str, output: str, name: str, axes: str | None) -> onnx.NodeProto:
    """Unsqueeze/Squeeze of axis 2: axes as an input from opset 13, as an attribute before."""
    if axes is None:
        return helper.make_node(op_type, [value], [output], name=name, axes=[2])
    return helper.make_node(op_type, [value, axes], [output], name=name)


def _widened_attributes(node: onnx.NodeProto) -> list[onnx.AttributeProto]:
    attributes = []
    for attribute in node.attribute:
        if attribute.name in _SPATIAL_ATTRIBUTES:
            values = [_SPATIAL_ATTRIBUTES[attribute.name], *attribute.ints]
        elif attribute.name == "pads":
            begin, end = attribute.ints
            values = [0, begin, 0, end]
        else:
            attributes.append(attribute)
            continue
        attributes.append(helper.make_attribute(attribute.name, values))
    return attributes


def _warn_of_grouped_convs_over_three_axes(graph: onnx.GraphProto) -> None:
    """ConvGrad's overrun is the same for a kernel of three spatial axes, which this pass does not rewrite (no model
    it was measured on has one): said, not silent."""
    names = [
        node.name or node.output[0]
        for node in graph.node
        if node.op_type == "Conv" and _group(node) > 1 and len(_ints(node, "kernel_shape") or []) >= 3
    ]
    if names:
        logger.warning(
            "ort_zero: grouped Convs over three spatial axes (%s): ORT 1.19.2's ConvGrad writes past the end of their "
            "input gradient (wrong gradients elsewhere, or a corrupted heap); ort_zero rewrites only one-axis ones",
            ", ".join(names),
        )


def run(exported: ExportedGraph) -> WidenedConvs:
    model = exported.model
    graph = model.graph
    _warn_of_grouped_convs_over_three_axes(graph)
    convs = one_axis_grouped_convs(graph)
    if not convs:
        return WidenedConvs([])
    axes = None
    if _opset(model) >= 13:
        axes = "ort_zero_grouped_conv_1d_axis"
        graph.initializer.append(numpy_helper.from_array(np.array([2], dtype=np.int64), axes))
    for conv in convs:
        position = list(graph.node).index(conv)
        prefix = conv.name or conv.output[0]
        x4, w4, y4 = f"{prefix}/ort_zero_x4", f"{prefix}/ort_zero_w4", f"{prefix}/ort_zero_y4"
        added = [
            _axis_op("Unsqueeze", conv.input[0], x4, f"{prefix}/ort_zero_unsqueeze_x", axes),
            _axis_op("Unsqueeze", conv.input[1], w4, f"{prefix}/ort_zero_unsqueeze_w", axes),
            helper.make_node("Conv", [x4, w4, *conv.input[2:]], [y4], name=prefix),
            _axis_op("Squeeze", y4, conv.output[0], f"{prefix}/ort_zero_squeeze_y", axes),
        ]
        added[2].attribute.extend(_widened_attributes(conv))
        graph.node.remove(conv)
        for offset, node in enumerate(added):
            graph.node.insert(position + offset, node)
    return WidenedConvs([conv.name or conv.output[0] for conv in convs])


PASS = GraphPass("grouped_conv_1d", run, edits=frozenset({Edit.INSERT, Edit.REWIRE, Edit.REWRITE}))
