"""Editing ONNX graphs for the passes: rewiring values, retyping a PythonOp's input, the trigger PythonOp, registering
a Function a pass inserts. Building and reading a PythonOp node is `ort_zero.python_op`; a bridge's,
`ort_zero.zero3.bridge_nodes`."""

from __future__ import annotations

from collections.abc import Iterable

import onnx
import torch

from ...foreign import onnxruntime as ort_internals
from ...python_op import function_name, function_name_of, ints_attribute, make_python_op, set_ints_attribute


def is_zero3_graph(graph: onnx.GraphProto) -> bool:
    """A graph of ort_zero's ZeRO-3 export: its modules gather through PreForwardBridge."""
    from ...zero3.bridges import PreForwardBridge

    return any(function_name_of(node) == function_name(PreForwardBridge) for node in graph.node)


def python_ops(graph: onnx.GraphProto, name: str) -> list[onnx.NodeProto]:
    """The PythonOps of one autograd Function, in graph (topological) order."""
    return [node for node in graph.node if function_name_of(node) == name]


def replace_input_uses(nodes: Iterable[onnx.NodeProto], old: str, new: str) -> None:
    for node in nodes:
        for index, name in enumerate(node.input):
            if name == old:
                node.input[index] = new


def retype_python_op_input(node: onnx.NodeProto, index: int, rank: int, elem_type: int) -> None:
    """Keep a PythonOp's declared input rank/type in step with the tensor now wired to input `index`."""
    ranks = ints_attribute(node, "input_tensor_ranks")
    types = ints_attribute(node, "input_tensor_types")
    ranks[index], types[index] = rank, elem_type
    set_ints_attribute(node, "input_tensor_ranks", ranks)
    set_ints_attribute(node, "input_tensor_types", types)


def make_trigger_python_op(
    func: str, trigger: str, outputs: list[str], node_name: str, output_shape_rank: int = 1
) -> onnx.NodeProto:
    """A PythonOp `func(len(outputs), trigger)` returning one rank-1 float tensor per output (plus ORT's ctx)."""
    return make_python_op(
        func,
        node_name,
        int_scalars=[len(outputs)],
        inputs=[(trigger, 1, onnx.TensorProto.FLOAT)],
        outputs=[(name, output_shape_rank, onnx.TensorProto.FLOAT) for name in outputs],
    )


def register_function(cls: type[torch.autograd.Function]) -> None:
    """Make an autograd Function that no trace has seen (one a pass inserts) callable from ORT PythonOps."""
    ort_internals.register_autograd_function(function_name(cls), cls)
