"""Handing the gradient ORT computed for a gathered parameter to DeepSpeed, without a copy where it is safe.

`param.backward(grad)` runs PyTorch's AccumulateGrad, which takes a gradient over only when nothing else holds it;
ORT always does (the gradient is a view of ORT's buffer), so every step paid one copy of the model's gradients into
fresh memory, whose page faults cost four times the copy (45 ms for a 98 MB embedding gradient on this CPU).

Where AccumulateGrad would do nothing but store the gradient (no gradient yet, no tensor hooks, a contiguous
gradient of the parameter's shape), the gradient becomes `param.grad` as it is and the post-accumulate hooks run at
once, as AccumulateGrad runs them: DeepSpeed's copies it into its reduce bucket, or keeps it there for the next
reduce-scatter. ORT may write other values into its buffer once the PythonOp returns, so a gradient DeepSpeed kept
is reduced now (the next gradient would reduce it before anything else anyway), or copied when that is not possible.
"""

from __future__ import annotations

import torch

from ..foreign import deepspeed as ds_internals
from ..foreign import torch as torch_internals


def hand_over(param: torch.nn.Parameter, grad: torch.Tensor) -> None:
    """Accumulate `grad`, a view of memory ORT owns only while its PythonOp runs, into `param` for DeepSpeed."""
    hooks = torch_internals.post_accumulate_grad_hooks(param)
    if not _storable(param, grad) or not hooks:
        param.backward(grad)
        return
    ort_memory = grad.untyped_storage().data_ptr()  # DeepSpeed may point the tensor elsewhere (`grad.data = ...`)
    param.grad = grad
    for hook in hooks:
        hook(param)
    if _in_memory(param.grad, ort_memory):
        optimizer = ds_internals.stage3_optimizer_behind(param)
        if optimizer is not None:
            ds_internals.reduce_bucketed_gradients(optimizer, param)
    if _in_memory(param.grad, ort_memory):
        param.grad = param.grad.clone()


def _storable(param: torch.nn.Parameter, grad: torch.Tensor) -> bool:
    """Whether AccumulateGrad would store `grad` as it is (and run only the post-accumulate hooks)."""
    return (
        param.grad is None
        and not torch_internals.tensor_grad_hooks(param)
        and grad.shape == param.shape
        and grad.dtype == param.dtype
        and grad.device == param.device
        and grad.is_contiguous()
        and not grad.requires_grad
    )


def _in_memory(held: torch.Tensor | None, data_ptr: int) -> bool:
    return held is not None and held.numel() > 0 and held.untyped_storage().data_ptr() == data_ptr
