"""Any autograd Function in a model (the user's or a library's) exported as a PythonOp ORT can run and differentiate.

ORT 1.19.2 exports a Function's call as a PythonOp whose outputs must all be tensors, and its PythonOpGrad takes one
gradient per input, present wherever ORT differentiates the input. PyTorch is laxer, and libraries rely on it: TRL's
`ChunkedLogProbFunction` returns None for outputs it was not asked for (ORT's exporter records no rank for them and
its runner stops on `is_()`), PhiMoE's multiplier returns None gradients for inputs ORT differentiates (the gradient
node that reads them fails), Reformer's reversible layers return a trailing None beyond their inputs (ORT's
PythonOpGrad refuses the count). While a ZeRO-3 model is exported, `Function.apply` runs every Function but ort_zero's
and ORT's own through `with_tensor_outputs(function)`, which exports as the same computation with:

- tensor outputs only: a non-tensor output (None, a number, a string, a tuple of them) leaves the graph and the caller
  gets it back as the constant it was at export, as a trace keeps every Python value. Whether it really is a constant
  is checked on every run in ORT: a value that changes with the data stops the step with the Function's name. Any
  other non-tensor output (a list of tensors, an object) stops the export naming the Function;
- one gradient per input: trailing Nones beyond the inputs dropped (as PyTorch drops them), zeros where the backward
  returns None for a floating-point input ORT differentiates (torch's None means zeros).

A Function whose `apply` was bound before the export (`op = MyFunction.apply` at import) calls torch's `apply`
itself and is exported as ORT exports it. ORT names the PythonOp after the wrapper, `<module>.<Function's qualified
name>.WithTensorOutputs`. A Function's `infer_shape` (ORT's shape-inference callback) is kept; `OUTPUT_SHAPES`
declares it for Functions whose output ORT must know the shape of and that have none (PhiMoE's: ORT's gradient of a
Mul that broadcasts a PythonOp output whose shape it does not know leaves the broadcast dimensions unreduced).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from ...foreign import onnxruntime as ort_internals
from ...python_op import function_name
from ..step.tensor_outputs import OutputLayout, with_tensor_outputs


def _exported_as_is(function: type) -> bool:
    """ort_zero's own Functions (bridges, PythonOps, wrappers) and ORT's, and those ORT exports its own way."""
    module = function.__module__ or ""
    return (
        module.split(".")[0] in ("ort_zero", "onnxruntime")
        or "wrapped_by_ort_zero" in vars(function)
        or ort_internals.has_own_function_export(function_name(function))
    )


def _inputs(function: type, args: tuple, kwargs: dict) -> tuple:
    """The Function's inputs as positional arguments (what its forward and backward count)."""
    if not kwargs:
        return args
    forward = inspect.signature(function.forward)
    with_ctx = function.setup_context is torch.autograd.Function.setup_context
    bound = forward.bind(*((None,) if with_ctx else ()), *args, **kwargs)
    bound.apply_defaults()
    if bound.kwargs:
        raise TypeError(f"ort_zero: {function_name(function)} takes keyword-only arguments")
    return bound.args[1:] if with_ctx else bound.args


def applying_with_tensor_outputs(apply: Any) -> classmethod:
    """`Function.apply` while a ZeRO-3 model is exported: every Function but ort_zero's and ORT's own runs as
    `with_tensor_outputs(function)`, and its caller gets its outputs as the Function returns them."""

    def apply_function(cls: type, *args: Any, **kwargs: Any) -> Any:
        if _exported_as_is(cls):
            return apply.__get__(None, cls)(*args, **kwargs)
        layout = OutputLayout(function_name(cls))
        inputs = _inputs(cls, args, kwargs)
        layout.bool_inputs = {
            i for i, arg in enumerate(inputs) if isinstance(arg, torch.Tensor) and arg.dtype == torch.bool
        }
        inputs = [arg.to(torch.uint8) if i in layout.bool_inputs else arg for i, arg in enumerate(inputs)]
        tensors = with_tensor_outputs(cls).apply(*inputs, layout)
        return layout.outputs(tensors if isinstance(tensors, tuple) else (tensors,))

    return classmethod(apply_function)
