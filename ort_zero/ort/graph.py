"""Small helpers over ONNX graphs shared by the post-export passes."""

from __future__ import annotations

from collections.abc import Iterable

import onnx
import torch
from onnx import helper

PYTHON_OP = "PythonOp"
MS_DOMAIN = "com.microsoft"


def qualified_name(cls: type) -> str:
    """The name ORT's exporter stores in a PythonOp's `func_name` for an autograd Function."""
    return f"{cls.__module__}.{cls.__qualname__}"


def onnx_dtype(dtype: torch.dtype) -> int:
    from onnxruntime.training.utils import pytorch_type_to_onnx_dtype

    return int(pytorch_type_to_onnx_dtype(dtype))


def func_name(node: onnx.NodeProto) -> str | None:
    if node.op_type != PYTHON_OP:
        return None
    for attribute in node.attribute:
        if attribute.name == "func_name":
            return attribute.s.decode()
    return None


def python_ops(graph: onnx.GraphProto, name: str) -> list[onnx.NodeProto]:
    """The PythonOps of one autograd Function, in graph (topological) order."""
    return [node for node in graph.node if func_name(node) == name]


def replace_input_uses(nodes: Iterable[onnx.NodeProto], old: str, new: str) -> None:
    for node in nodes:
        for index, name in enumerate(node.input):
            if name == old:
                node.input[index] = new


def set_ints_attribute(node: onnx.NodeProto, name: str, values: list[int]) -> None:
    for attribute in list(node.attribute):
        if attribute.name == name:
            node.attribute.remove(attribute)
    node.attribute.append(helper.make_attribute(name, values))


def ints_attribute(node: onnx.NodeProto, name: str) -> list[int]:
    for attribute in node.attribute:
        if attribute.name == name:
            return list(attribute.ints)
    return []


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
    return helper.make_node(
        PYTHON_OP,
        [trigger],
        [f"{node_name}_ctx", *outputs],
        node_name,
        domain=MS_DOMAIN,
        func_name=func,
        input_convention="cd",
        input_int_scalars=[len(outputs)],
        input_int_scalar_positions=[0],
        input_tensor_ranks=[1],
        input_tensor_types=[onnx.TensorProto.FLOAT],
        output_tensor_ranks=[output_shape_rank] * len(outputs),
        output_tensor_types=[onnx.TensorProto.FLOAT] * len(outputs),
        training_mode=1,
        comment="",
    )
