"""A torch computation run inside an ORT PythonOp with its own autograd graph kept for the PythonOp's backward: the
values and gradients are torch's, and what the graph saves is what torch's kernels save (nothing computed twice).

ORT reuses the buffers of a PythonOp's inputs and outputs once the forward graph is done with them, and copies only
the inputs a Function saves with `save_for_backward`: a kept graph therefore runs on copies of the inputs it is
differentiated through and hands ORT a copy of its output. ORT accepts contiguous tensors only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ...hooks.export_mode import is_exporting


def forward_keeping_graph(
    ctx: Any,
    op: Callable[..., torch.Tensor],
    tensors: tuple[torch.Tensor, ...],
    differentiable: tuple[bool, ...] | None = None,
) -> torch.Tensor:
    """`op(*tensors)` run by torch with autograd on (a Function's forward runs without), its graph kept in `ctx` when
    an input wants a gradient. `differentiable` (default: all) says which inputs the graph may differentiate: the
    others (masks, indices) get no gradient, but are copied too, as the graph may read them in the backward."""
    differentiable = differentiable or (True,) * len(tensors)
    wanted = tuple(w and d for w, d in zip(ctx.needs_input_grad[: len(tensors)], differentiable, strict=True))
    keep = any(wanted) and not is_exporting()  # the trace's forward has no backward
    with torch.enable_grad():
        inputs = tuple(
            (t.detach().clone() if keep else t.detach()).requires_grad_(w) for t, w in zip(tensors, wanted, strict=True)
        )
        output = op(*inputs)
    ctx.graph = (inputs, output) if keep else None
    return output.detach().clone(memory_format=torch.contiguous_format) if keep else output.contiguous()


def backward_through_graph(ctx: Any, grad: torch.Tensor, non_tensors: int) -> tuple[torch.Tensor | None, ...]:
    """The gradients of the forward's tensor inputs by torch's autograd on the kept graph (zeros where ORT asks for
    one the graph does not give), None for the `non_tensors` arguments after them."""
    inputs, output = ctx.graph
    ctx.graph = None
    wanted = [t for t in inputs if t.requires_grad]
    grads = iter(torch.autograd.grad(output, wanted, grad))
    results = []
    for t, asked in zip(inputs, ctx.needs_input_grad, strict=False):
        if t.requires_grad:
            results.append(next(grads).contiguous())
        elif asked and t.is_floating_point():
            results.append(torch.zeros_like(t, memory_format=torch.contiguous_format))
        else:
            results.append(None)
    return (*results, *([None] * non_tensors))
