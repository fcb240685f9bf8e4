"""Autograd Functions (and no_grad blocks) in model code whose gradients ORT's PythonOps take otherwise than PyTorch:
Reformer's backward returns a gradient beyond its inputs (PyTorch drops it, ORT refuses it), PhiMoE's returns None
where ORT still builds a gradient output, and HRM's no_grad cycles are differentiated in an ONNX graph, which has no
grad mode. While such a model is exported the backward gives one gradient per input, zeros for None, and a stack
called inside the model's no_grad passes a zero gradient."""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from typing import Any

import torch

from .model_rewrite import ModelRewrite, Replacement


def one_gradient_per_input(backward: staticmethod, forward: Callable[..., Any]) -> staticmethod:
    """An autograd Function's `backward` that returns one gradient per input of its `forward` (whose first argument
    is ctx): trailing Nones beyond them are dropped, as PyTorch drops them; a gradient there is an error."""
    inputs = len(inspect.signature(forward).parameters) - 1

    @functools.wraps(backward.__func__)
    def backward_per_input(ctx: Any, *grads: Any) -> tuple[Any, ...]:
        result = backward.__func__(ctx, *grads)
        result = result if isinstance(result, tuple) else (result,)
        if any(extra is not None for extra in result[inputs:]):
            raise RuntimeError(f"{backward.__func__.__qualname__} returned gradients beyond its {inputs} inputs")
        return result[:inputs]

    return staticmethod(backward_per_input)


def reformer_one_gradient_per_input(replaced: staticmethod) -> staticmethod:
    """Reformer's `_ReversibleFunction.backward` with one gradient per input of its forward."""
    from ...foreign.transformers import reformer_reversible_forward

    return one_gradient_per_input(replaced, reformer_reversible_forward())


@functools.cache  # one class per Function: ORT registers a PythonOp's Function by its name at each export
def with_zero_gradients(
    function: type[torch.autograd.Function], *, shaped_like_input: int | None = None
) -> type[torch.autograd.Function]:
    """An autograd Function that runs `function`'s forward and backward, and returns zeros where `function`'s
    backward returns None for a floating-point input that requires a gradient. ORT gives a PythonOp a gradient
    output for every input on a differentiable path (whatever the backward returns, and through a detach, which the
    export drops) and leaves it unset when the backward returns None: the gradient node that reads it fails on a
    missing input. Zeros are what torch's None means, so the gradients are the same.

    With `shaped_like_input`, ORT is told that the output has that input's shape and type (`infer_shape`): without a
    shape for a PythonOp's output, ORT's gradient of a broadcasting Mul that reads it does not reduce the broadcast
    dimensions, and the Function's backward receives a gradient of the broadcast shape."""

    def forward(ctx: Any, *args: Any) -> Any:
        ctx.ort_zero_inputs = [
            (arg.shape, arg.dtype, arg.device) if isinstance(arg, torch.Tensor) and arg.is_floating_point() else None
            for arg in args
        ]
        return function.forward(ctx, *args)

    def backward(ctx: Any, *grads: Any) -> Any:
        results = function.backward(ctx, *grads)
        results = results if isinstance(results, tuple) else (results,)
        return tuple(
            torch.zeros(meta[0], dtype=meta[1], device=meta[2])
            if result is None and meta is not None and wanted
            else result
            for result, meta, wanted in zip(results, ctx.ort_zero_inputs, ctx.needs_input_grad, strict=True)
        )

    def infer_shape(node: Any, shapes: list, dtypes: list) -> tuple[list, list]:
        return [shapes[shaped_like_input]], [dtypes[shaped_like_input]]

    members = {"forward": staticmethod(forward), "backward": staticmethod(backward)}
    if shaped_like_input is not None:
        members["infer_shape"] = staticmethod(infer_shape)
    # a direct subclass of Function: ORT registers no other kind of class for a PythonOp
    return type(f"{function.__name__}WithZeroGradients", (torch.autograd.Function,), members)


def phimoe_multiplier(multiplier: type[torch.autograd.Function]) -> type[torch.autograd.Function]:
    """`PhimoeMultiplier(scores, multiplier, selected_experts, masked_gates, mask_for_one)` returns `multiplier *
    mask_for_one` (the same shape as the multiplier); its backward gives a gradient to the scores only."""
    return with_zero_gradients(multiplier, shaped_like_input=1)


class _ModelNoGrad:
    """How many `torch.no_grad()` blocks HRM's model code is in while it is exported (`counting_no_grad`)."""

    depth = 0


def counting_no_grad(replaced: type) -> type:
    """`torch.no_grad` while a model is exported: the same context, and a block that HRM's modeling code enters (the
    caller's module) is counted in `_ModelNoGrad`. ORT exports, and runs its output-schema forward, under no_grad
    blocks of its own, so grad mode cannot tell the model's apart."""

    class no_grad(replaced):  # noqa: N801 - torch's name
        def __enter__(self) -> None:
            self.counted = sys._getframe(1).f_globals.get("__name__", "") == _HRM_TEXT  # HRM's own blocks only
            super().__enter__()
            _ModelNoGrad.depth += self.counted

        def __exit__(self, *exc: object) -> None:
            _ModelNoGrad.depth -= self.counted
            super().__exit__(*exc)

    return no_grad


class ZeroGradient(torch.autograd.Function):
    """The identity whose gradient is zero: what `detach` means inside an ONNX graph, which has no grad mode (ORT
    refuses a PythonOp gradient of None for an input it differentiates)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.detach().clone(memory_format=torch.contiguous_format)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(grad, memory_format=torch.contiguous_format)


def detached_under_model_no_grad(replaced: Callable[..., Any]) -> Callable[..., Any]:
    """A module's `forward` whose output gets no gradient when the model called it inside its own no_grad."""

    @functools.wraps(replaced)
    def forward(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        output = replaced(self, *args, **kwargs)
        return ZeroGradient.apply(output) if _ModelNoGrad.depth else output

    return forward


_REFORMER = "transformers.models.reformer.modeling_reformer"
REFORMER = ModelRewrite(
    "export_reformer",
    _REFORMER,
    ("reformer",),
    "Reformer's reversible layers run in an autograd Function (`_ReversibleFunction`, a PythonOp in ORT's graph) "
    "whose backward returns 12 gradients for its 11 inputs (a trailing None): PyTorch drops extra Nones, ORT's "
    "PythonOpGrad stops the backward (outputs sizes 11 vs 12). ORT takes the backward the exporter registers: "
    "while the model is exported it is one that returns one gradient per input",
    (
        Replacement(
            "transformers.reformer_reversible_backward_in_export", "transformers",
            f"{_REFORMER}:_ReversibleFunction", "backward", reformer_one_gradient_per_input,
        ),
    ),
)  # fmt: skip
_PHIMOE = "transformers.models.phimoe.modeling_phimoe"
PHIMOE = ModelRewrite(
    "export_phimoe",
    _PHIMOE,
    ("phimoe",),
    "PhiMoE's router multiplies by PhimoeMultiplier, an autograd Function whose backward gives a gradient to the "
    "scores only, though the multiplier (a GatherElements of the softmax) and the softmax it is also given require "
    "one: ORT's PythonOp gradient then leaves those gradients unset, and the GatherElements gradient fails on its "
    "missing input; and ORT's gradient of the Mul that broadcasts the Function's output (a PythonOp output has no "
    "shape for it) does not reduce the broadcast. While it is exported, the Function's backward returns zeros for "
    "those inputs (what torch's None means) and its output is declared to have the multiplier's shape",
    (
        Replacement(
            "transformers.phimoe_multiplier_in_export", "transformers", _PHIMOE, "PhimoeMultiplier", phimoe_multiplier,
        ),
    ),
)  # fmt: skip
_HRM_TEXT = "transformers.models.hrm_text.modeling_hrm_text"
HRM_TEXT = ModelRewrite(
    "export_hrm_text",
    _HRM_TEXT,
    ("hrm_text",),
    "HRM runs its first low-level cycles under torch.no_grad() (only the last L_bp_cycles of each high-level cycle "
    "pass gradients back), and an ONNX graph has no grad mode: ORT differentiated every cycle (other gradients, "
    "losses 7e-5 off native's within 3 steps). While it is exported, a stack called inside a no_grad the model "
    "entered returns its output through a Function whose gradient is zero (the cycles before it get none, as in "
    "PyTorch; ORT still runs their backward, on zeros)",
    (
        Replacement("torch.no_grad_counted_in_hrm_text_export", "torch", "torch", "no_grad", counting_no_grad),
        Replacement(
            "transformers.hrm_text_stack_detached_in_export", "transformers", f"{_HRM_TEXT}:HrmTextStack", "forward",
            detached_under_model_no_grad,
        ),
    ),
)  # fmt: skip
