"""Export pass: a Cast to the type its input already has, whose output one node reads at more than one input.

ORT 1.19.2's cast propagation (on in ORTModule by default) first removes every Cast to its input's own type
(`RemoveUnnecessaryCasts`). When one consumer reads such a Cast's output at two inputs (`x * x`, as the L2 norm in
the linear attention of Qwen3.5/Qwen3-Next, Kimi Linear, Inkling 2 and Bailing's hybrid attention computes), the
removal fails on the consumer's second edge (`Graph::RemoveEdge: Argument mismatch when removing edge`; the pattern
alone reproduces it, tests/unit/ort/passes/test_same_type_casts.py) and ORT builds no graph. Such a Cast is the
identity, so this pass removes it before ORT sees the graph and its consumers read its input instead. Every other
same-type Cast is left to ORT's own pass.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import onnx

from ..graph.edit import replace_input_uses
from ..graph.types import element_types
from .base import ExportedGraph, GraphPass
from .contract import Edit

logger = logging.getLogger(__name__)


@dataclass
class RemovedCasts:
    removed: list[str]

    def log(self) -> None:
        if self.removed:
            logger.info("ort_zero: removed %d same-type Casts whose output a node reads twice", len(self.removed))


def _cast_to(node: onnx.NodeProto) -> int | None:
    return next((attribute.i for attribute in node.attribute if attribute.name == "to"), None)


def tripping_casts(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The Casts to their input's own type whose output some node reads at more than one input (not graph outputs).

    The types come from the graph's value_info, which ORT's symbolic shape inference writes; without it (ORTModule's
    `run_symbolic_shape_infer` off) from ONNX's shape inference, run on a copy only then."""
    graph = model.graph
    outputs = {output.name for output in graph.output}
    read_twice = {name for node in graph.node for name in set(node.input) if name and list(node.input).count(name) > 1}
    casts = [
        node
        for node in graph.node
        if node.op_type == "Cast"
        and node.domain in ("", "ai.onnx")
        and node.output[0] in read_twice
        and node.output[0] not in outputs
        and _cast_to(node) is not None
    ]
    types = element_types(graph)
    if any(cast.input[0] not in types for cast in casts):
        types = {**element_types(onnx.shape_inference.infer_shapes(model).graph), **types}
    return [cast for cast in casts if types.get(cast.input[0]) == _cast_to(cast)]


def run(exported: ExportedGraph) -> RemovedCasts:
    graph = exported.model.graph
    casts = tripping_casts(exported.model)
    removed = {cast.output[0] for cast in casts}
    for cast in casts:
        graph.node.remove(cast)
        replace_input_uses(graph.node, cast.output[0], cast.input[0])
    for value in [value for value in graph.value_info if value.name in removed]:
        graph.value_info.remove(value)
    return RemovedCasts([cast.name for cast in casts])


PASS = GraphPass("same_type_casts", run, edits=frozenset({Edit.REMOVE, Edit.REWIRE}))
