"""ort_zero's side of ORT's PythonOp contract: how an autograd Function is named in a PythonOp, how a PythonOp's
attributes are read, the callbacks ORT asks a Function for (shape inference, input aliases), and the registries
through which a PythonOp's integer arguments reach Python objects (`KeyedRegistry`).

Below every other layer: the hooks' and ZeRO-3 bridges' Functions answer ORT's callbacks with it, and the ORT graph
passes find and read ort_zero's PythonOps with it. Imports `onnx` only when a callback parses a node.
"""

from __future__ import annotations

import functools
import itertools
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import torch

if TYPE_CHECKING:
    import onnx

T = TypeVar("T")

PYTHON_OP = "PythonOp"
PYTHON_OP_GRAD = "PythonOpGrad"
MS_DOMAIN = "com.microsoft"

# ORT reports an exception raised in a PythonOp's Python callback as its own RuntimeError ("Non-zero status code
# returned while running PythonOp node ... Get null result"), without the exception: the cause (a peer lost during a
# gather) is gone by the time the caller of the graph sees it. ort_zero's Functions note it here (`records_errors`).
ORT_PYTHON_OP_FAILURE = "running PythonOp node"
_raised_in_callback: list[BaseException] = []  # the last exception one of ort_zero's Functions raised
FunctionClass = TypeVar("FunctionClass", bound=type)


def records_errors(function_class: FunctionClass) -> FunctionClass:
    """An autograd Function whose forward and backward note what they raise, for `cause_of` (a class decorator)."""
    for name in ("forward", "backward"):
        setattr(function_class, name, staticmethod(_noting_errors(getattr(function_class, name))))
    return function_class


def _noting_errors(callback: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(callback)
    def noting(*args: Any, **kwargs: Any) -> Any:
        try:
            return callback(*args, **kwargs)
        except Exception as error:
            _raised_in_callback[:] = [error]
            raise

    return noting


def cause_of(error: BaseException) -> BaseException:
    """What one of ort_zero's Functions raised inside ORT when `error` is ORT's report of a failed PythonOp; else
    `error` itself."""
    if ORT_PYTHON_OP_FAILURE in str(error) and _raised_in_callback:
        return _raised_in_callback[0]
    return error


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


def context_of(node: onnx.NodeProto) -> str:
    """ORT's autograd context of a PythonOp: its output 0, before its tensor outputs."""
    return node.output[0]


def gradient_context(node: onnx.NodeProto) -> str | None:
    """The context a PythonOp's gradient node reads (its input 0); None for any other node."""
    return node.input[0] if node.op_type == PYTHON_OP_GRAD and node.input else None


def output_type(node: onnx.NodeProto, slot: int) -> tuple[int, int]:
    """(rank, ONNX element type) of a PythonOp's or PythonOpGrad's output `slot` (a PythonOp's output 0 is its
    context, which has none)."""
    tensor_slot = slot - 1 if node.op_type == PYTHON_OP else slot
    ranks, types = ints_attribute(node, "output_tensor_ranks"), ints_attribute(node, "output_tensor_types")
    return ranks[tensor_slot], types[tensor_slot]


def first_output(node: onnx.NodeProto) -> tuple[str, int, int]:
    """The first output a PythonOp(Grad) computes, as (name, rank, ONNX element type): a value that exists only once
    the node has run."""
    slot = next(slot for slot, value in enumerate(node.output) if value and (slot or node.op_type != PYTHON_OP))
    return (node.output[slot], *output_type(node, slot))


def set_ints_attribute(node: onnx.NodeProto, name: str, values: list[int]) -> None:
    from onnx import helper

    for attribute in list(node.attribute):
        if attribute.name == name:
            node.attribute.remove(attribute)
    node.attribute.append(helper.make_attribute(name, values))


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
    from onnx import helper

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


class KeyedRegistry(Generic[T]):
    """Objects a PythonOp finds by the integer it carries: ORT stores a PythonOp's non-tensor arguments as scalars,
    so a module's state, a parameter or a subscriber travels through the graph as a key into one of these.

    One lifetime rule for all of them: an entry lives while something else holds its object (the registry holds it
    weakly) and until it is removed; a graph that still names a key whose object is gone gets an error that says so.
    """

    def __init__(self, what: str) -> None:
        self.what = what
        self._entries: weakref.WeakValueDictionary[int, T] = weakref.WeakValueDictionary()
        self._next_key = itertools.count(1)

    def add(self, entry: T, key: int | None = None) -> int:
        """Registers `entry` under `key` (a fresh one when None) and returns the key."""
        key = next(self._next_key) if key is None else key
        self._entries[key] = entry
        return key

    def remove(self, key: int) -> None:
        self._entries.pop(key, None)

    def __getitem__(self, key: int) -> T:
        try:
            return self._entries[key]
        except KeyError:
            raise RuntimeError(
                f"ort_zero: no {self.what} for key {key}: it was unsubscribed or collected (disable_zero3, the engine "
                "or the model destroyed) while an exported graph still refers to it"
            ) from None
