"""What every pass-through autograd Function in ort_zero needs, so that it also works as an ONNX Runtime PythonOp.

ort_zero's Functions (ZeRO-3 bridges, statistics recorders) return their tensor inputs unchanged and act only by
side effect. Exported by ORTModule they become PythonOps, which imposes rules kept here in one place: outputs are
new tensor objects, every input that wants a gradient gets one (ORT's gradient Sum nodes fail on a missing one, so
an output that got no gradient contributes zeros), and ORT's shape inference is told that outputs have the inputs'
shapes and types (`ort_zero.python_op`). ORT is also told which outputs share their input's memory, so that it plans
them in the input's buffer instead of copying each one at every module boundary.

Who owns that memory differs between PyTorch and ORT. In PyTorch an output is a view that keeps its input's memory
alive, as any view does. In an ORT training graph ORT's buffer plan must be the only owner: ORT frees a buffer after
the last reader of every value planned in it, but never releases a value planned in another's buffer, so a view
that owned its memory would keep every activation crossing a module boundary alive until the backward ends. The
training-graph pass `ort_zero.ort.passes.passthrough_buffers` therefore tells each PythonOp how ORT planned it:
its outputs and gradients are then `borrowed` views, or copies where ORT plans a buffer of their own.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch

from ..foreign import torch as torch_internals
from ..python_op import alias_maps, function_name
from .export_mode import is_exporting

PythonOpKey = tuple[str, tuple[int, ...]]
"""A PythonOp as its Python call sees it: the Function's name and its integer arguments."""


@dataclass(frozen=True)
class OpPlan:
    """How ORT planned one PythonOp: the outputs (by tensor input) in buffers of their own (`copied`: the Function
    returns copies of those inputs) and the rest in their inputs' (borrowed views), and the tensor inputs whose
    gradient ORT plans in the output gradient's buffer (borrowed; the other gradients are copies)."""

    copied: frozenset[int]
    borrowed_grads: frozenset[int]


class BufferPlans:
    """ORT's buffer plan for the pass-through PythonOps of one training graph (`ort_zero.ort.passes.
    passthrough_buffers` makes it; the model's ORTModule keeps it). The Functions find their PythonOp's plan by key
    while the plan lasts; it is forgotten with its model's ORT graphs (the model falls back to PyTorch, whose views
    must own their memory), and goes with the model."""

    def __init__(self) -> None:
        self._ops: dict[PythonOpKey, OpPlan] = {}

    def plan(
        self, name: str, scalars: tuple[int, ...], *, copied: frozenset[int], borrowed_grads: frozenset[int]
    ) -> None:
        """How the PythonOp of Function `name` with integer arguments `scalars` returns its tensors from now on."""
        key = (name, scalars)
        self._ops[key] = OpPlan(copied, borrowed_grads)
        _PLANS[key] = self

    def planned(self, name: str, scalars: tuple[int, ...]) -> OpPlan | None:
        """This graph's plan for the PythonOp, if it made one and no newer graph replaced it."""
        key = (name, scalars)
        return self._ops.get(key) if _PLANS.get(key) is self else None

    def forget(self) -> None:
        """Back to PyTorch's views for this graph's PythonOps (plans a newer graph made for them stay)."""
        for key in self._ops:
            if _PLANS.get(key) is self:
                del _PLANS[key]
        self._ops.clear()


# Whose plans a PythonOp's Python call follows: the call knows only its Function and integer arguments, which no two
# models' graphs share (each module's key is its own). Held weakly: an entry lives as long as its model keeps the
# plans, and a newer graph of the same model replaces it.
_PLANS: weakref.WeakValueDictionary[PythonOpKey, BufferPlans] = weakref.WeakValueDictionary()


def _plan_of(key: PythonOpKey) -> OpPlan | None:
    plans = _PLANS.get(key)
    return plans.planned(*key) if plans is not None else None


def borrowed(tensor: torch.Tensor) -> torch.Tensor:
    """A view of `tensor`'s memory that does not keep the memory alive (ORT's buffer plan owns it)."""
    if tensor.numel() == 0:
        return tensor.detach()
    storage = tensor.untyped_storage()
    unowned = torch_internals.unowned_storage(storage.data_ptr(), tensor.device, storage.nbytes())
    view = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
    return view.set_(unowned, tensor.storage_offset(), tensor.size(), tensor.stride())


def passed_through(
    ctx: Any, function: type, scalars: tuple[int, ...], tensors: tuple[torch.Tensor, ...]
) -> tuple[torch.Tensor, ...]:
    """The pass-through outputs of `function(*scalars, *tensors)`, remembering what its backward needs."""
    plan = _plan_of((function_name(function), scalars))
    ctx.set_materialize_grads(False)
    ctx.input_meta = [
        (t.shape, t.dtype, t.device) if wanted else None
        for t, wanted in zip(tensors, ctx.needs_input_grad[len(scalars) :], strict=False)
    ]
    ctx.borrowed_grads = plan.borrowed_grads if plan else None
    if is_exporting():
        # A forward run by PyTorch to trace or read the schema (e.g. the inference graph's export after training):
        # no ORT buffer owns these tensors, so a borrowed view would outlive its memory.
        ctx.borrowed_grads = None
        return tuple(t.detach() for t in tensors)
    if plan is None:
        return tuple(t.detach() for t in tensors)
    return tuple(t.detach().clone() if index in plan.copied else borrowed(t) for index, t in enumerate(tensors))


def input_grads(ctx: Any, grads: tuple[torch.Tensor | None, ...]) -> list[torch.Tensor | None]:
    """The output gradients passed through to the inputs, with zeros where an output got none; under ORT, borrowed
    where ORT planned them in the output gradient's buffer, copies of ORT's buffers elsewhere."""
    result: list[torch.Tensor | None] = []
    for index, (grad, meta) in enumerate(zip(grads, ctx.input_meta, strict=False)):
        if grad is None:
            result.append(torch.zeros(meta[0], dtype=meta[1], device=meta[2]) if meta else None)
        elif ctx.borrowed_grads is None:
            result.append(grad)
        else:
            result.append(borrowed(grad) if index in ctx.borrowed_grads else grad.clone())
    return result


# The shared parts of the Functions applied as `apply(key, *tensors)` that return their tensors and act by side
# effect (ORT registers only direct subclasses of torch.autograd.Function, so they share functions, not a base):
#     backward = staticmethod(keyed_backward); infer_shape = staticmethod(python_op.same_shapes)
#     alias_input = staticmethod(keyed_alias_input)
#     forward ends in `return passed_through(ctx, TheFunction, (key,), tensors)`


def keyed_backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[Any, ...]:
    """Gradients pass straight through (none for the key)."""
    return (None, *input_grads(ctx, grads))


def keyed_alias_input(node_proto: bytes) -> tuple[list, list]:
    return alias_maps(node_proto, non_tensor_inputs=1)
