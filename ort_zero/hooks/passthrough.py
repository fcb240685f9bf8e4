"""What every pass-through autograd Function in ort_zero needs, so that it also works as an ONNX Runtime PythonOp.

ort_zero's Functions (ZeRO-3 bridges, statistics recorders) return their tensor inputs unchanged and act only by
side effect. Exported by ORTModule they become PythonOps, which imposes three rules kept here in one place:
outputs are new tensor objects (detached views), every input that wants a gradient gets one (ORT's gradient Sum
nodes fail on a missing one, so an output that got no gradient contributes zeros), and ORT's shape inference is
told that outputs have the inputs' shapes and types.
"""

from __future__ import annotations

from typing import Any

import torch


def detached(tensors: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    return tuple(t.detach() for t in tensors)


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


def same_shapes(node: Any, shapes: list, dtypes: list) -> tuple[list, list]:
    """ORT shape inference for a pass-through PythonOp: outputs as inputs."""
    return shapes, dtypes
