"""What the recompute tests read off a training graph the pass has rewritten."""

from __future__ import annotations

import importlib

import onnx

import ort_zero  # noqa: E402, F401, I001  (before ORT: makes ORTModule importable on today's torch)

importlib.import_module("onnxruntime.training.ortmodule")

from ort_zero.ort.passes.recompute import RECOMPUTE_SUFFIX  # noqa: E402
from ort_zero.python_op import function_name, function_name_of, ints_attribute  # noqa: E402
from ort_zero.zero3.ort_bridges import RecomputeParamsBridge  # noqa: E402

from ..conftest import Call  # noqa: E402


def by_name(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    return {node.name: node for node in graph.node}


def bridges_of(graph: onnx.GraphProto, func: type) -> dict[int, onnx.NodeProto]:
    """The `func` PythonOps by their first integer scalar (a region's key, or a module's)."""
    found = [node for node in graph.node if function_name_of(node) == function_name(func)]
    by_key = {ints_attribute(node, "input_int_scalars")[0]: node for node in found}
    assert len(by_key) == len(found), f"two {func.__name__} nodes for one key"
    return by_key


def params_bridges(graph: onnx.GraphProto) -> dict[int, onnx.NodeProto]:
    """RecomputeParamsBridge nodes by the key of the module whose parameters they gather."""
    return bridges_of(graph, RecomputeParamsBridge)


def copies(graph: onnx.GraphProto) -> list[str]:
    return sorted(node.name for node in graph.node if node.name.endswith(RECOMPUTE_SUFFIX))


def forward_names(graph: onnx.GraphProto) -> set[str]:
    """The nodes the YieldOp depends on (itself included)."""
    producer = {out: node for node in graph.node for out in node.output if out}
    yield_op = next(node for node in graph.node if node.op_type == "YieldOp")
    seen, stack = {yield_op.name}, [yield_op]
    while stack:
        for value in stack.pop().input:
            node = producer.get(value)
            if node is not None and node.name not in seen:
                seen.add(node.name)
                stack.append(node)
    return seen


def descendants(graph: onnx.GraphProto, name: str) -> set[str]:
    """The nodes that depend on node `name` (itself included)."""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for value in node.input:
            consumers.setdefault(value, []).append(node)
    start = by_name(graph)[name]
    seen, stack = {name}, [start]
    while stack:
        for value in stack.pop().output:
            for node in consumers.get(value, ()):
                if node.name not in seen:
                    seen.add(node.name)
                    stack.append(node)
    return seen


def region_values(calls: list[Call]) -> dict[str, set[str]]:
    """Per layer call, the values its forward region computes (not its inputs, not the autograd contexts)."""
    values = {}
    for call in calls:
        t = call.tag
        values[t] = {f"{t}_xi", f"{t}_w", f"{t}_h", f"{t}_d", f"{t}_mask", f"{t}_di"}
        if call.foreign == "before_dropout":
            values[t].add(f"{t}_hf")
        if call.foreign == "before_inner":
            values[t].add(f"{t}_xf")
    return values


def assert_well_formed(graph: onnx.GraphProto) -> None:
    """Topologically sorted, every value produced once, every input produced before its reader or given."""
    available = {value.name for value in graph.input} | {tensor.name for tensor in graph.initializer}
    for node in graph.node:
        missing = [value for value in node.input if value and value not in available]
        assert not missing, f"{node.name} reads {missing} before they are produced"
        produced_again = [value for value in node.output if value and value in available]
        assert not produced_again, f"{node.name} produces {produced_again} again"
        available.update(value for value in node.output if value)
    assert {value.name for value in graph.output} <= available


def backward_reads(graph: onnx.GraphProto, values: set[str]) -> list[str]:
    """'node <- value' for each read of `values` by a node that is not forward (backward, floating or added)."""
    forward = forward_names(graph)
    return [
        f"{node.name} <- {value}"
        for node in graph.node
        if node.name not in forward
        for value in node.input
        if value in values
    ]


def seeds(graph: onnx.GraphProto) -> dict[str, int]:
    return {
        node.name: next(a.i for a in node.attribute if a.name == "seed")
        for node in graph.node
        if node.op_type == "Dropout" and any(a.name == "seed" for a in node.attribute)
    }


# ----------------------------------------------------------------------------------------------------------------
# Tests
