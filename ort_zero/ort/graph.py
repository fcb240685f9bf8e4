"""Small helpers over ONNX graphs shared by the post-export passes."""

from __future__ import annotations

from collections.abc import Iterable

import onnx
import torch
from onnx import helper

from ..hooks.passthrough import function_name as qualified_name

PYTHON_OP = "PythonOp"
MS_DOMAIN = "com.microsoft"


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


def is_zero3_graph(graph: onnx.GraphProto) -> bool:
    """A graph of ort_zero's ZeRO-3 export: its modules gather through PreForwardBridge."""
    from ..zero3.bridges import PreForwardBridge

    return any(func_name(node) == qualified_name(PreForwardBridge) for node in graph.node)


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
        qualified_name(func),
        node_name,
        int_scalars=[key, *(p.ds_id for p in params)],
        inputs=[after],
        outputs=[(f"{node_name}_{j}", len(p.ds_shape), onnx_dtype(p.dtype)) for j, p in enumerate(params)],
        training_mode=0,
        input_convention="cd" + "c" * len(params),
    )


_UNREGISTER_AT_EXIT: list[bool] = []


def register_function(cls: type[torch.autograd.Function]) -> None:
    """Make an autograd Function that no trace has seen callable from ORT PythonOps.

    ORT's registry must be emptied before the interpreter ends (or the process crashes at exit); ORTModule arranges
    that only when it enables custom Functions itself, so it is arranged here too, once."""
    import atexit

    from onnxruntime.capi._pybind_state import register_torch_autograd_function, unregister_python_functions

    if not _UNREGISTER_AT_EXIT:
        atexit.register(unregister_python_functions)
        _UNREGISTER_AT_EXIT.append(True)
    from onnxruntime.training.ortmodule._custom_autograd_function_exporter import (
        register_custom_function_schema_supplementary,
    )

    register_torch_autograd_function(qualified_name(cls), cls)
    register_custom_function_schema_supplementary(cls)
