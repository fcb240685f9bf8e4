"""Editing ONNX graphs and building ort_zero's PythonOp nodes: the one place the passes do either (reading a PythonOp
is `ort_zero.python_op`)."""

from __future__ import annotations

from collections.abc import Iterable

import onnx
import torch
from onnx import helper

from ...foreign import ortmodule
from ...python_op import MS_DOMAIN, PYTHON_OP, function_name, function_name_of, ints_attribute, onnx_dtype


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


def set_ints_attribute(node: onnx.NodeProto, name: str, values: list[int]) -> None:
    for attribute in list(node.attribute):
        if attribute.name == name:
            node.attribute.remove(attribute)
    node.attribute.append(helper.make_attribute(name, values))


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


def make_python_op(
    func: str,
    node_name: str,
    int_scalars: list[int],
    inputs: list[tuple[str, int, int]],
    outputs: list[tuple[str, int, int]],
    training_mode: int = 1,
    input_convention: str | None = None,
) -> onnx.NodeProto:
    """A PythonOp calling autograd Function `func` as `forward(ctx, *int_scalars, *inputs)`, or in the order of
    `input_convention` ("c" an integer scalar, "d" a tensor, e.g. "cdcc").

    `inputs` and `outputs` are (name, rank, ONNX element type); ORT adds the ctx as output 0 (named
    `<node_name>_ctx`). With `training_mode=0` ORT runs it without autograd, as inside an inference graph.
    """
    convention = input_convention or "c" * len(int_scalars) + "d" * len(inputs)
    return helper.make_node(
        PYTHON_OP,
        [name for name, _, _ in inputs],
        [f"{node_name}_ctx", *(name for name, _, _ in outputs)],
        node_name,
        domain=MS_DOMAIN,
        func_name=func,
        input_convention=convention,
        input_int_scalars=int_scalars,
        input_int_scalar_positions=[i for i, kind in enumerate(convention) if kind == "c"],
        input_tensor_ranks=[rank for _, rank, _ in inputs],
        input_tensor_types=[elem_type for _, _, elem_type in inputs],
        output_tensor_ranks=[rank for _, rank, _ in outputs],
        output_tensor_types=[elem_type for _, _, elem_type in outputs],
        training_mode=training_mode,
        comment="",
    )


def make_params_bridge(
    func: type[torch.autograd.Function], node_name: str, key: int, params: list, after: tuple[str, int, int]
) -> onnx.NodeProto:
    """A PythonOp of an ORT-only bridge (`func`) that runs once the value `after` (name, rank, element type) exists
    and outputs module `key`'s `params` gathered: `forward(ctx, key, after, *ds_ids)`, without autograd."""
    return make_python_op(
        function_name(func),
        node_name,
        int_scalars=[key, *(p.ds_id for p in params)],
        inputs=[after],
        outputs=[(f"{node_name}_{j}", len(p.ds_shape), onnx_dtype(p.dtype)) for j, p in enumerate(params)],
        training_mode=0,
        input_convention="cd" + "c" * len(params),
    )


def register_function(cls: type[torch.autograd.Function]) -> None:
    """Make an autograd Function that no trace has seen (one a pass inserts) callable from ORT PythonOps."""
    ortmodule.register_autograd_function(function_name(cls), cls)
