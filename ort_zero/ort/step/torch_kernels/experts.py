"""Mixture-of-experts blocks as torch's own computation inside ORT's graph.

transformers' experts implementations route tokens with data-dependent shapes: the default `grouped_mm` counts
tokens per expert with `torch.histc` (which torch's exporter cannot write), `eager` loops in Python over the experts
a batch routes to (a trace keeps that batch's routing), and `batched_mm` exports but indexes every expert's weights
once per (token, expert) pair. While a ZeRO-3 model is exported, the implementation a model's config picks is run by
`ExpertsInTorch`, which ORT runs as a PythonOp: its forward is the implementation itself (sorted tokens and grouped
matmuls for `grouped_mm`) and its backward torch's autograd on the graph it kept.

The experts run on their own ZeRO-3 parameters (`modules`: what the kept graph saves). Every rank gathers the whole
experts parameter whatever its tokens' routing, so ranks never wait on each other.

While a ZeRO-3 model is traced for its export, its partitioned weights are stand-ins of zeros (`ort.export.context`):
the experts' output is then zeros, and the trace records the PythonOp, not what it computed; so the trace's grouped
matmuls are not run (MoE 87M at seq 512: 0.3 s of a 1.1-s trace).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ....hooks.export_mode import is_exporting, is_stand_in
from .context import wanted_grads
from .failures import kernel_failure
from .modules import backward_on_own_params, forward_on_own_params, own_params

_INPUTS = 3  # hidden_states, top_k_index, top_k_weights


class ExpertsInTorch(torch.autograd.Function):
    """`implementation(experts, hidden_states, top_k_index, top_k_weights)` run by torch; `params` are the module's
    own parameters as ORT has them (gathered)."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden_states: torch.Tensor,
        top_k_index: torch.Tensor,
        top_k_weights: torch.Tensor,
        experts: torch.nn.Module,
        implementation: Callable[..., torch.Tensor],
        *params: torch.Tensor,
    ) -> torch.Tensor:
        wanted_grads(ctx, hidden_states, top_k_index, top_k_weights, experts, implementation, *params)
        if is_exporting() and params and all(is_stand_in(param) for param in params):
            return torch.zeros_like(hidden_states)  # transformers' implementations return the tokens' dtype
        try:
            return forward_on_own_params(
                ctx, experts, implementation, (hidden_states, top_k_index, top_k_weights), params
            )
        except RuntimeError as error:
            raise kernel_failure(
                f"the experts (experts_implementation '{_implementation_name(experts)}')",
                f"{tuple(hidden_states.shape)} {hidden_states.dtype} tokens", error,
                "load the model with another experts_implementation (e.g. 'eager')",
            ) from error  # fmt: skip

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return backward_on_own_params(ctx, grad, inputs=_INPUTS, non_tensors=2)

    @staticmethod
    def infer_shape(node: Any, shapes: list, dtypes: list) -> tuple[list, list]:
        return [shapes[0]], [dtypes[0]]


def _has_modules_with_params(experts: torch.nn.Module) -> bool:
    """Parameters of modules inside the block are gathered by those modules' own bridges, which run only where the
    exporter traces the block (a post-expert norm): such a block is traced as it is."""
    return any(True for child in experts.children() for _ in child.parameters())


def _implementation_name(experts: torch.nn.Module) -> str:
    config = getattr(experts, "config", None)
    return str(getattr(config, "_experts_implementation", None) or "eager")


def experts_in_torch(replaced: Callable[..., Callable[..., Any]]) -> Callable[..., Callable[..., Any]]:
    """The patch's factory for transformers' `ExpertsInterface.get_interface`: the implementation it picks, run as
    `ExpertsInTorch` while a model is exported (calls with other arguments go to the implementation itself)."""

    def get_interface(self: Any, experts_implementation: str, default: Callable[..., Any]) -> Callable[..., Any]:
        implementation = replaced(self, experts_implementation, default)

        def experts_forward(experts: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            if (
                kwargs
                or len(args) != _INPUTS
                or not all(isinstance(a, torch.Tensor) for a in args)
                or _has_modules_with_params(experts)
            ):
                return implementation(experts, *args, **kwargs)
            return ExpertsInTorch.apply(*args, experts, implementation, *own_params(experts))

        return experts_forward

    return get_interface
