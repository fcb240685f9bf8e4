"""Which of a kernel's arguments want a gradient, however ORT runs it.

torch gives a Function's context `needs_input_grad`. ORT runs the kernels' PythonOps without torch's autograd
(`passes.unchecked_kernels`): the context is then a plain object, and ORT has marked each tensor it hands over with
whether the graph wants its gradient."""

from __future__ import annotations

from typing import Any

import torch


def wanted_grads(ctx: Any, *args: Any) -> tuple[bool, ...]:
    """`ctx.needs_input_grad`, set from the tensors' `requires_grad` where ORT's plain context has none."""
    if not hasattr(ctx, "needs_input_grad"):
        ctx.needs_input_grad = tuple(isinstance(a, torch.Tensor) and a.requires_grad for a in args)
    return ctx.needs_input_grad
