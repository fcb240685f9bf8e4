"""Training-graph pass: a 16-bit Split becomes Slices of its input, in its own dtype.

ORT 1.19.2's CPU Split and SplitTraining refuse bfloat16 and float16 when they run ("Split operator does not support
BFloat16 yet"), so `half_precision_casts` would run them in float32 between Casts. A LLaMA's rotary embedding splits
each layer's queries and keys in halves (ORT fuses `x[..., :d/2]` and `x[..., d/2:]` into a Split), and the
gradient of its `cat` is a SplitTraining: at 162M, seq 1024, bf16 their Casts and float32 splits took 0.2 s of a
6 s step (ORT's profiler, 2026-12-01). A split moves data only, and ORT's CPU Slice moves any element type: each
output becomes a Slice of the input between the cumulative sums of the split's lengths (computed in the graph: a
SplitTraining's lengths are its ConcatTraining's, known only when it runs; being computed, they also keep ORT's
optimizer from fusing the Slices into a Split again), and a split into one output is the Identity. A Split without a
lengths input (equal parts) is left to `half_precision_casts`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..graph.kernels import has_kernel
from ..graph.widening import HALF_TYPES, declares_16_bit
from .base import GraphPass, TrainingGraph
from .contract import Edit
from .half_precision_casts import PROVIDERS

logger = logging.getLogger(__name__)

SPLITS = frozenset({"Split", "SplitTraining"})


@dataclass
class SlicedSplits:
    sliced: int = 0

    def log(self) -> None:
        if self.sliced:
            logger.info("ort_zero: %d 16-bit Splits ORT cannot run in 16 bits move their data as Slices", self.sliced)


def run(training: TrainingGraph) -> SlicedSplits:
    graph = training.graph
    report = SlicedSplits()
    if not declares_16_bit(graph):
        return report  # a float32 model's graph: no type inference for it
    types, opsets = training.element_types(), list(training.opsets)
    provider = PROVIDERS.get(training.device, "CPUExecutionProvider")
    nodes: list[onnx.NodeProto] = []
    for position, node in enumerate(graph.node):
        slices = None
        if _sliceable(node, types) and not has_kernel(node, types, opsets, provider):
            slices = _as_slices(node, node.name or f"{node.op_type}_{position}", graph, types)
            if not all(has_kernel(part, types, opsets, provider) for part in slices):
                slices = None  # the provider moves no such data: half_precision_casts widens the split
        if slices is None:
            nodes.append(node)
            continue
        nodes += slices
        report.sliced += 1
    del graph.node[:]
    graph.node.extend(nodes)
    return report


def _sliceable(node: onnx.NodeProto, types: dict[str, int]) -> bool:
    return (
        node.op_type in SPLITS and node.domain in ("", "ai.onnx", "com.microsoft")
        and types.get(node.input[0]) in HALF_TYPES and len(node.input) > 1 and bool(node.input[1])
    )  # fmt: skip


def _as_slices(
    node: onnx.NodeProto, prefix: str, graph: onnx.GraphProto, types: dict[str, int]
) -> list[onnx.NodeProto]:
    """The nodes that write the split's outputs as Slices of its input (`types` and `graph`'s initializers learn
    what they add)."""
    data, lengths = node.input[0], node.input[1]
    outputs = list(node.output)
    if len(outputs) == 1:
        return [helper.make_node("Identity", [data], outputs, f"{prefix}/whole")]
    axis = next((attribute.i for attribute in node.attribute if attribute.name == "axis"), 0)

    def constant(name: str, values: list[int]) -> str:
        full = f"{prefix}/{name}"
        graph.initializer.append(numpy_helper.from_array(numpy.array(values, dtype=numpy.int64), full))
        types[full] = TensorProto.INT64
        return full

    def value(name: str) -> str:
        full = f"{prefix}/{name}"
        types[full] = TensorProto.INT64
        return full

    ends, starts = value("ends"), value("starts")
    made = [
        helper.make_node("CumSum", [lengths, constant("axis0", [0])], [ends], f"{prefix}/cumsum"),
        helper.make_node("Sub", [ends, lengths], [starts], f"{prefix}/starts"),
    ]
    axes = constant("axes", [axis])
    for index, output in enumerate(outputs):
        if not output:
            continue
        at, after = constant(f"at{index}", [index]), constant(f"after{index}", [index + 1])
        start, end = value(f"start{index}"), value(f"end{index}")
        made += [
            helper.make_node("Slice", [starts, at, after], [start], f"{prefix}/start{index}"),
            helper.make_node("Slice", [ends, at, after], [end], f"{prefix}/end{index}"),
            helper.make_node("Slice", [data, start, end, axes], [output], f"{prefix}/slice{index}"),
        ]
    return made


PASS = GraphPass("sixteen_bit_splits", run, edits=frozenset({Edit.INSERT, Edit.REMOVE}))
