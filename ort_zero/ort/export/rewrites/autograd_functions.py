"""no_grad blocks in model code, which an ONNX graph cannot express: HRM's no_grad cycles are differentiated in an
ONNX graph, which has no grad mode. While such a model is exported a stack called inside the model's no_grad passes a
zero gradient. (Autograd Functions whose outputs or gradients ORT takes otherwise than PyTorch, PhiMoE's and
Reformer's among them, are exported by `ort_zero.ort.export.autograd` for every model.)"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import torch

from .model_rewrite import ModelRewrite, Replacement


class _ModelNoGrad:
    """How many `torch.no_grad()` blocks HRM's model code is in while it is exported (`counting_no_grad`)."""

    depth = 0


def counting_no_grad(replaced: type) -> type:
    """`torch.no_grad` while a model is exported: the same context, and a block that HRM's modeling code enters (the
    caller's module) is counted in `_ModelNoGrad`. ORT exports under no_grad blocks of its own, so grad mode cannot
    tell the model's apart."""

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
        Replacement("torch.no_grad_counted_in_hrm_text_export", "torch.no_grad", counting_no_grad),
        Replacement(
            "transformers.hrm_text_stack_detached_in_export", f"{_HRM_TEXT}:HrmTextStack.forward",
            detached_under_model_no_grad,
        ),
    ),
)  # fmt: skip
