"""A 16-bit node made to compute in float32: its 16-bit inputs read through Casts to float32, its 16-bit outputs
written in float32 and Cast back to their type where it wrote them. That is what torch's CPU kernels do with bf16
elementwise math (compute in float32, round the result once). The passes that widen nodes ORT cannot build or run
in 16-bit (`passes.half_precision_schemas`, `passes.half_precision_casts`) share it, and the run record reads back
which nodes were widened from the Casts' names."""

from __future__ import annotations

from collections import Counter

import onnx
from onnx import TensorProto, helper

from .types import element_types

HALF_TYPES = {TensorProto.BFLOAT16: "bfloat16", TensorProto.FLOAT16: "float16"}
WIDEN, NARROW = "widen_input", "narrow_output"  # the names of the Casts a widening inserts end with these and a number


def widened(
    node: onnx.NodeProto, prefix: str, types: dict[str, int]
) -> tuple[list[onnx.NodeProto], onnx.NodeProto, list[onnx.NodeProto]]:
    """Casts to float32 of the node's 16-bit inputs, the node reading them (its 16-bit outputs written in float32),
    and the Casts of those outputs back to their type, named after `prefix` (unique in the graph); `types` learns
    the new values."""
    before, after = [], []
    wide = onnx.NodeProto()
    wide.CopyFrom(node)
    for index, name in enumerate(node.input):
        if name and types.get(name) in HALF_TYPES:
            cast_name = f"{prefix}/{WIDEN}{index}"
            wide.input[index] = f"{cast_name}_out"
            before.append(helper.make_node("Cast", [name], [wide.input[index]], cast_name, to=TensorProto.FLOAT))
            types[wide.input[index]] = TensorProto.FLOAT
    for index, name in enumerate(node.output):
        if name and types.get(name) in HALF_TYPES:
            cast_name = f"{prefix}/{NARROW}{index}"
            wide.output[index] = f"{cast_name}_in"
            after.append(helper.make_node("Cast", [wide.output[index]], [name], cast_name, to=types[name]))
            types[wide.output[index]] = TensorProto.FLOAT
    return before, wide, after


def half_values(node: onnx.NodeProto, types: dict[str, int]) -> list[str]:
    """The node's inputs and outputs of a 16-bit float type."""
    return [name for name in (*node.input, *node.output) if name and types.get(name) in HALF_TYPES]


def declares_16_bit(graph: onnx.GraphProto | None) -> bool:
    """Whether a graph declares a bf16 or fp16 value: a 16-bit model's."""
    return graph is not None and any(elem_type in HALF_TYPES for elem_type in element_types(graph).values())


def widened_record(graph: onnx.GraphProto | None) -> dict[str, int]:
    """Evidence read back from a graph: per op type, the nodes that compute in float32 for want of a 16-bit kernel
    or schema."""
    record: Counter = Counter()
    for node in graph.node if graph is not None else ():
        if node.op_type != "Cast" and any(
            f"/{WIDEN}" in name or f"/{NARROW}" in name for name in (*node.input, *node.output)
        ):
            record[node.op_type] += 1
    return dict(sorted(record.items()))
