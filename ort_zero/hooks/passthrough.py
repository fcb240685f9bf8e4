"""What every pass-through autograd Function in ort_zero needs, so that it also works as an ONNX Runtime PythonOp.

ort_zero's Functions (ZeRO-3 bridges, statistics recorders) return their tensor inputs unchanged and act only by
side effect. Exported by ORTModule they become PythonOps, which imposes three rules kept here in one place:
outputs are new tensor objects (detached views), every input that wants a gradient gets one (ORT's gradient Sum
nodes fail on a missing one, so an output that got no gradient contributes zeros), and ORT's shape inference is
told that outputs have the inputs' shapes and types. ORT is also told which outputs share their input's memory
(`alias_maps`): otherwise it copies every such output, at every module boundary.
"""

from __future__ import annotations

from typing import Any

import torch


def detached(tensors: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    return tuple(t.detach() for t in tensors)


def function_name(cls: type) -> str:
    """The name ORT's exporter stores in a PythonOp's `func_name` for an autograd Function."""
    return f"{cls.__module__}.{cls.__qualname__}"


# PythonOps (Function name, integer arguments) whose outputs must be new tensors, not views of their inputs: ORT plans
# no alias for the node before its YieldOp (`ort_zero.ort.yield_copies`).
_RETURNING_COPIES: set[tuple[str, tuple[int, ...]]] = set()


def return_copies(name: str, scalars: tuple[int, ...]) -> None:
    """From now on the PythonOp of Function `name` called with integer arguments `scalars` returns copies."""
    _RETURNING_COPIES.add((name, scalars))


def returns_copies(function: type, *scalars: int) -> bool:
    return (function_name(function), scalars) in _RETURNING_COPIES


def remember_inputs(ctx: Any, tensors: tuple[torch.Tensor, ...], skip: int) -> None:
    """Keep what `input_grads` needs: which inputs want a gradient, and their shapes.

    `skip` counts the non-tensor arguments before `tensors` in the Function's `forward`.
    """
    ctx.set_materialize_grads(False)
    ctx.input_meta = [
        (t.shape, t.dtype, t.device) if wanted else None
        for t, wanted in zip(tensors, ctx.needs_input_grad[skip:], strict=False)
    ]


def input_grads(ctx: Any, grads: tuple[torch.Tensor | None, ...]) -> list[torch.Tensor | None]:
    """The output gradients passed through to the inputs, with zeros where an output got none."""
    return [
        torch.zeros(meta[0], dtype=meta[1], device=meta[2]) if grad is None and meta is not None else grad
        for grad, meta in zip(grads, ctx.input_meta, strict=False)
    ]


# The shared parts of the Functions applied as `apply(key, *tensors)` that return their tensors and act by side
# effect (ORT registers only direct subclasses of torch.autograd.Function, so they share functions, not a base):
#     backward = staticmethod(keyed_backward); infer_shape = staticmethod(same_shapes)
#     alias_input = staticmethod(keyed_alias_input)
#     forward ends in `return passed_through(ctx, tensors, returns_copies(TheFunction, key))`


def keyed_backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[Any, ...]:
    """Gradients pass straight through (none for the key)."""
    return (None, *input_grads(ctx, grads))


def keyed_alias_input(node_proto: bytes) -> tuple[list, list]:
    return alias_maps(node_proto, non_tensor_inputs=1)


def passed_through(ctx: Any, tensors: tuple[torch.Tensor, ...], copies: bool = False) -> tuple[torch.Tensor, ...]:
    """The end of a keyed pass-through `forward`: remember what backward needs, return the tensors as new objects
    (copies when `copies`, see `returns_copies`)."""
    remember_inputs(ctx, tensors, skip=1)
    return tuple(t.detach().clone() for t in tensors) if copies else detached(tensors)


def same_shapes(node: Any, shapes: list, dtypes: list) -> tuple[list, list]:
    """ORT shape inference for a pass-through PythonOp: outputs as inputs."""
    return shapes, dtypes


def alias_maps(node_proto: bytes, non_tensor_inputs: int, passed_through: int | None = None) -> tuple[list, list]:
    """ORT input-alias maps for a PythonOp whose first `passed_through` tensor outputs are views of its first tensor
    inputs (all of them when None), so that ORT plans them as reused buffers instead of copying each one.

    Forward map: one entry per output (ORT's context output excluded), the index of the argument it shares memory
    with among all `forward` arguments (non-tensor ones first, as in the signature), or -1. Backward map: all -1
    here; which output gradients exist is known only in the gradient graph, where `ort_zero.ort.grad_reuse` sets
    the gradient nodes' reuse so that each passed-through gradient is handed back without a copy.
    """
    import onnx

    node = onnx.NodeProto()
    node.ParseFromString(node_proto)
    outputs, tensor_inputs = len(node.output) - 1, len(node.input)
    through = min(outputs, tensor_inputs) if passed_through is None else passed_through
    forward = [non_tensor_inputs + i if i < through else -1 for i in range(outputs)]
    return forward, [-1] * (non_tensor_inputs + tensor_inputs)
