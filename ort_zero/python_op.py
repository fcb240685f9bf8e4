"""ort_zero's side of ORT's PythonOp contract: how an autograd Function is named in a PythonOp, how a PythonOp's
attributes are read, and the callbacks ORT asks a Function for (shape inference, input aliases).

Below every other layer: the hooks' and ZeRO-3 bridges' Functions answer ORT's callbacks with it, and the ORT graph
passes find and read ort_zero's PythonOps with it. Imports `onnx` only when a callback parses a node.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    import onnx

PYTHON_OP = "PythonOp"
MS_DOMAIN = "com.microsoft"


def function_name(cls: type) -> str:
    """The name ORT's exporter stores in a PythonOp's `func_name` for an autograd Function."""
    return f"{cls.__module__}.{cls.__qualname__}"


def function_name_of(node: onnx.NodeProto) -> str | None:
    """The autograd Function a node runs (its `function_name`); None when it is not a PythonOp."""
    if node.op_type != PYTHON_OP:
        return None
    for attribute in node.attribute:
        if attribute.name == "func_name":
            return attribute.s.decode()
    return None


def ints_attribute(node: onnx.NodeProto, name: str) -> list[int]:
    """A node's integer-list attribute; [] when it has none (e.g. a PythonOp's `input_int_scalars`)."""
    for attribute in node.attribute:
        if attribute.name == name:
            return list(attribute.ints)
    return []


def int_scalars(node: onnx.NodeProto) -> list[int]:
    """The integer arguments of a PythonOp of ort_zero's Functions (its `input_int_scalars`); an error naming the node
    when it has none, as no such PythonOp has."""
    scalars = ints_attribute(node, "input_int_scalars")
    if not scalars:
        raise RuntimeError(f"ort_zero: PythonOp {node.name} has no integer scalar inputs; it is not an ort_zero bridge")
    return scalars


def onnx_dtype(dtype: torch.dtype) -> int:
    """The ONNX element type of a torch dtype, as ORT maps it."""
    from onnxruntime.training.utils import pytorch_type_to_onnx_dtype

    return int(pytorch_type_to_onnx_dtype(dtype))


def parse_node(node_proto: bytes) -> onnx.NodeProto:
    """The node ORT hands a Function's `alias_input` callback, serialized."""
    import onnx

    node = onnx.NodeProto()
    node.ParseFromString(node_proto)
    return node


def same_shapes(node: Any, shapes: list, dtypes: list) -> tuple[list, list]:
    """ORT shape inference for a pass-through PythonOp: outputs as inputs."""
    return shapes, dtypes


def alias_maps(node_proto: bytes, non_tensor_inputs: int, passed_through: int | None = None) -> tuple[list, list]:
    """ORT input-alias maps for a PythonOp whose first `passed_through` tensor outputs are views of its first tensor
    inputs (all of them when None), so that ORT plans them in their inputs' buffers instead of copying each one.

    Forward map: one entry per output (ORT's context output excluded), the index of the argument it shares memory
    with among all `forward` arguments (non-tensor ones first, as in the signature), or -1. Backward map: all -1
    here; which output gradients exist is known only in the gradient graph, where
    `ort_zero.ort.passes.passthrough_buffers` plans each passed-through gradient in its output gradient's buffer.
    """
    node = parse_node(node_proto)
    outputs, tensor_inputs = len(node.output) - 1, len(node.input)
    through = min(outputs, tensor_inputs) if passed_through is None else passed_through
    forward = [non_tensor_inputs + i if i < through else -1 for i in range(outputs)]
    return forward, [-1] * (non_tensor_inputs + tensor_inputs)
