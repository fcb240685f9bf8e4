"""How a value travels unchanged through a training graph: through Identities and through ort_zero's pass-through
PythonOps (bridges and statistics recorders), whose forward output o (0 is the context) is their tensor input
`tensor_reuse_map[o]` and whose gradient nodes pass each output's gradient on as that input's.

The training-graph passes that follow a model output forward to the kernel that made it (`yield_from_makers`) or a
gradient backward to where it is consumed (`scalar_output_grads`, `passthrough_buffers`) walk it here.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from ...hooks.passthrough import PythonOpKey
from ...hooks.statistics import EndStep, RecordStatistics
from ...python_op import context_of, function_name, function_name_of, gradient_context, ints_attribute
from ...zero3.bridges import PostForwardBridge, PreForwardBridge, StepStartBridge

PASS_THROUGH_FUNCTIONS = frozenset(
    function_name(function)
    for function in (StepStartBridge, PreForwardBridge, PostForwardBridge, RecordStatistics, EndStep)
)
"""The Functions that return their inputs through `hooks.passthrough` (the exporter traces them into the forward)."""
REUSE = "tensor_reuse_map"


def is_pass_through(node: onnx.NodeProto) -> bool:
    return function_name_of(node) in PASS_THROUGH_FUNCTIONS


def python_op_key(node: onnx.NodeProto) -> PythonOpKey:
    """What a PythonOp's Python call knows it by: its Function and its integer arguments."""
    return function_name_of(node) or "", tuple(ints_attribute(node, "input_int_scalars"))


def producers(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    return {value: node for node in graph.node for value in node.output}


def before_identities(value: str, producer: dict[str, onnx.NodeProto]) -> str:
    """The value that Identities pass on as `value`."""
    while (node := producer.get(value)) is not None and node.op_type == "Identity":
        value = node.input[0]
    return value


def passed_through_input(node: onnx.NodeProto, value: str) -> int:
    """The tensor input of pass-through PythonOp `node` that its output `value` is (-1: none)."""
    return ints_attribute(node, REUSE)[list(node.output).index(value)]


def made_by(value: str, producer: dict[str, onnx.NodeProto]) -> str:
    """The value that Identities and pass-through PythonOps pass on as `value`: what the kernel that made it made."""
    while True:
        value = before_identities(value, producer)
        node = producer.get(value)
        if node is None or not is_pass_through(node):
            return value
        tensor_input = passed_through_input(node, value)
        if tensor_input < 0:
            return value
        value = node.input[tensor_input]


def is_op(node: onnx.NodeProto, op_type: str) -> bool:
    """`node` is the standard ONNX op `op_type` (not a contrib op of the same name)."""
    return node.op_type == op_type and node.domain in ("", "ai.onnx")


def yield_op_of(graph: onnx.GraphProto) -> onnx.NodeProto | None:
    """The YieldOp, where the forward hands its outputs over and the backward begins (None: not a training graph)."""
    return next((node for node in graph.node if node.op_type == "YieldOp"), None)


@dataclass
class GradientPaths:
    """Where a gradient travels unchanged in a graph: through Identities and the pass-through PythonOps' gradient
    nodes (by context value, each forward node's alias map)."""

    consumers: dict[str, list[onnx.NodeProto]]
    alias_maps: dict[str, list[int]]

    @classmethod
    def of(cls, graph: onnx.GraphProto) -> GradientPaths:
        consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in graph.node:
            for name in node.input:
                consumers.setdefault(name, []).append(node)
        maps = {context_of(node): ints_attribute(node, REUSE) for node in graph.node if is_pass_through(node)}
        return cls(consumers, maps)

    def passed_on(self, value: str, node: onnx.NodeProto) -> list[str] | None:
        """What `node` makes of `value` unchanged, or None where it computes with it."""
        if is_op(node, "Identity"):
            return [node.output[0]]
        forward_map = self.alias_maps.get(gradient_context(node) or "")
        if forward_map is None:
            return None
        made = []
        for position, name in enumerate(node.input):
            if name != value or position == 0:
                continue
            tensor_input = forward_map[position] if position < len(forward_map) else -1
            if not 0 <= tensor_input < len(node.output) or not node.output[tensor_input]:
                return None
            made.append(node.output[tensor_input])
        return made

    def everything_made_of(self, values: set[str]) -> set[str]:
        """`values` and every value passed on unchanged from them."""
        found, pending = set(values), list(values)
        while pending:
            value = pending.pop()
            for node in self.consumers.get(value, []):
                for made in self.passed_on(value, node) or []:
                    if made not in found:
                        found.add(made)
                        pending.append(made)
        return found
