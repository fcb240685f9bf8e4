"""What every pass-through autograd Function in ort_zero needs, so that it also works as an ONNX Runtime PythonOp.

ort_zero's Functions (ZeRO-3 bridges, statistics recorders) return their tensor inputs unchanged and act only by
side effect. Exported by ORTModule they become PythonOps, which imposes rules kept here in one place: outputs are
new tensor objects, every input that wants a gradient gets one (ORT's gradient Sum nodes fail on a missing one, so
an output that got no gradient contributes zeros), and ORT's shape inference is told that outputs have the inputs'
shapes and types. ORT is also told which outputs share their input's memory (`alias_maps`), so that it plans them
in the input's buffer instead of copying each one at every module boundary.

Who owns that memory differs between PyTorch and ORT. In PyTorch an output is a view that keeps its input's memory
alive, as any view does. In an ORT training graph ORT's buffer plan must be the only owner: ORT frees a buffer after
the last reader of every value planned in it, but never releases a value planned in another's buffer, so a view
that owned its memory would keep every activation crossing a module boundary alive until the backward ends
(`ort_zero.ort.passthrough_buffers`). There ORT runs the Functions in its unsafe mode (a plain object as ctx, no
autograd) and they return `borrowed` views, or copies where ORT plans an output in a buffer of its own.
"""

from __future__ import annotations

from typing import Any

import torch


def function_name(cls: type) -> str:
    """The name ORT's exporter stores in a PythonOp's `func_name` for an autograd Function."""
    return f"{cls.__module__}.{cls.__qualname__}"


# Set by `ort_zero.ort.passthrough_buffers` from ORT's plan of a training graph, per PythonOp (Function name,
# integer arguments): the ones whose outputs ORT plans in buffers of their own (they return copies), and for each
# PythonOp the tensor inputs whose gradient ORT plans in the output gradient's buffer (they return borrowed views).
_COPIED_OUTPUTS: set[tuple[str, tuple[int, ...]]] = set()
_BORROWED_GRADS: dict[tuple[str, tuple[int, ...]], frozenset[int]] = {}


def copy_outputs(name: str, scalars: tuple[int, ...]) -> None:
    """From now on the PythonOp of Function `name` called with integer arguments `scalars` returns copies."""
    _COPIED_OUTPUTS.add((name, scalars))


def borrow_grads(name: str, scalars: tuple[int, ...], tensor_inputs: frozenset[int]) -> None:
    """Under ORT, the PythonOp's gradients for these tensor inputs are borrowed views of its output gradients."""
    _BORROWED_GRADS[(name, scalars)] = tensor_inputs


def runs_in_ort(ctx: Any) -> bool:
    """Whether ORT runs this call as a PythonOp of a training graph: it passes a plain object, not autograd's ctx."""
    return not isinstance(ctx, torch.autograd.function.FunctionCtx)


def begin(ctx: Any, *args: Any) -> None:
    """The start of every `forward`: under ORT, `ctx` gets the `needs_input_grad` autograd would give it."""
    if runs_in_ort(ctx):
        ctx.needs_input_grad = tuple(isinstance(arg, torch.Tensor) and arg.requires_grad for arg in args)


def borrowed(tensor: torch.Tensor) -> torch.Tensor:
    """A view of `tensor`'s memory that does not keep the memory alive (ORT's buffer plan owns it)."""
    if tensor.numel() == 0:
        return tensor.detach()
    storage = tensor.untyped_storage()
    unowned = torch._C._construct_storage_from_data_pointer(storage.data_ptr(), tensor.device, storage.nbytes())
    view = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
    return view.set_(unowned, tensor.storage_offset(), tensor.size(), tensor.stride())


def passed_through(
    ctx: Any, function: type, scalars: tuple[int, ...], tensors: tuple[torch.Tensor, ...]
) -> tuple[torch.Tensor, ...]:
    """The pass-through outputs of `function(*scalars, *tensors)`, remembering what its backward needs."""
    key = (function_name(function), scalars)
    in_ort = runs_in_ort(ctx)
    if not in_ort:
        ctx.set_materialize_grads(False)
    ctx.input_meta = [
        (t.shape, t.dtype, t.device) if wanted else None
        for t, wanted in zip(tensors, ctx.needs_input_grad[len(scalars) :], strict=False)
    ]
    ctx.borrowed_grads = _BORROWED_GRADS.get(key, frozenset()) if in_ort else None
    if key in _COPIED_OUTPUTS:
        return tuple(t.detach().clone() for t in tensors)
    return tuple(borrowed(t) if in_ort else t.detach() for t in tensors)


def input_grads(ctx: Any, grads: tuple[torch.Tensor | None, ...]) -> list[torch.Tensor | None]:
    """The output gradients passed through to the inputs, with zeros where an output got none.

    Under ORT every gradient is a tensor (ORT makes zeros for the missing ones, shaped as at its first run, so a
    shape that differs from this call's marks one), and one ORT plans in its own buffer is copied.
    """
    result: list[torch.Tensor | None] = []
    for index, (grad, meta) in enumerate(zip(grads, ctx.input_meta, strict=False)):
        if ctx.borrowed_grads is None:
            result.append(torch.zeros(meta[0], dtype=meta[1], device=meta[2]) if grad is None and meta else grad)
        elif meta is None:
            result.append(None)
        elif grad is None or grad.shape != meta[0]:
            result.append(torch.zeros(meta[0], dtype=meta[1], device=meta[2]))
        else:
            result.append(borrowed(grad) if index in ctx.borrowed_grads else grad.clone())
    return result


# The shared parts of the Functions applied as `apply(key, *tensors)` that return their tensors and act by side
# effect (ORT registers only direct subclasses of torch.autograd.Function, so they share functions, not a base):
#     backward = staticmethod(keyed_backward); infer_shape = staticmethod(same_shapes)
#     alias_input = staticmethod(keyed_alias_input)
#     forward: `begin(ctx, key, *tensors)` first, `return passed_through(ctx, TheFunction, (key,), tensors)` last


def keyed_backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[Any, ...]:
    """Gradients pass straight through (none for the key)."""
    return (None, *input_grads(ctx, grads))


def keyed_alias_input(node_proto: bytes) -> tuple[list, list]:
    return alias_maps(node_proto, non_tensor_inputs=1)


def same_shapes(node: Any, shapes: list, dtypes: list) -> tuple[list, list]:
    """ORT shape inference for a pass-through PythonOp: outputs as inputs."""
    return shapes, dtypes


def alias_maps(node_proto: bytes, non_tensor_inputs: int, passed_through: int | None = None) -> tuple[list, list]:
    """ORT input-alias maps for a PythonOp whose first `passed_through` tensor outputs are views of its first tensor
    inputs (all of them when None), so that ORT plans them in their inputs' buffers instead of copying each one.

    Forward map: one entry per output (ORT's context output excluded), the index of the argument it shares memory
    with among all `forward` arguments (non-tensor ones first, as in the signature), or -1. Backward map: all -1
    here; which output gradients exist is known only in the gradient graph, where
    `ort_zero.ort.passthrough_buffers` plans each passed-through gradient in its output gradient's buffer.
    """
    import onnx

    node = onnx.NodeProto()
    node.ParseFromString(node_proto)
    outputs, tensor_inputs = len(node.output) - 1, len(node.input)
    through = min(outputs, tensor_inputs) if passed_through is None else passed_through
    forward = [non_tensor_inputs + i if i < through else -1 for i in range(outputs)]
    return forward, [-1] * (non_tensor_inputs + tensor_inputs)
