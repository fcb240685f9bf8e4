"""Mixture-of-experts blocks as torch's own computation inside ORT's graph.

transformers' experts implementations route tokens with data-dependent shapes: the default `grouped_mm` counts
tokens per expert with `torch.histc` (which torch's exporter cannot write), `eager` loops in Python over the experts
a batch routes to (a trace keeps that batch's routing), and `batched_mm` exports but indexes every expert's weights
once per (token, expert) pair. While a ZeRO-3 model is exported, the implementation a model's config picks is run by
`ExpertsInTorch`, which ORT runs as a PythonOp: its forward is the implementation itself (sorted tokens and grouped
matmuls for `grouped_mm`) and its backward torch's autograd on the graph it kept.

The experts' parameters are the PythonOp's inputs, so that ORT reads them from the module's pre-forward bridge and
hands their gradients to DeepSpeed as for any module; but the kept graph saves the module's own ZeRO-3 parameters,
not ORT's gathered copies: DeepSpeed releases them after the forward and gathers them again before the module's
backward (its post-forward bridge), as in native ZeRO-3, so no step holds every layer's experts gathered. Every rank
gathers the whole experts parameter whatever its tokens' routing, so ranks never wait on each other.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..kept_graph import backward_through_graph
from .failures import kernel_failure

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
        own = _own_params(experts)
        wanted = [ctx.needs_input_grad[0], False, ctx.needs_input_grad[2]]
        keep = any(ctx.needs_input_grad)
        with torch.enable_grad(), _holding(own, params):
            inputs = [
                (t.detach().clone() if keep else t.detach()).requires_grad_(w)
                for t, w in zip((hidden_states, top_k_index, top_k_weights), wanted, strict=True)
            ]
            try:
                output = implementation(experts, *inputs)
            except RuntimeError as error:
                raise kernel_failure(
                    f"the experts (experts_implementation '{_implementation_name(experts)}')",
                    f"{tuple(hidden_states.shape)} {hidden_states.dtype} tokens", error,
                    "load the model with another experts_implementation (e.g. 'eager')",
                ) from error  # fmt: skip
        ctx.graph = (inputs + [p for p in own if p.requires_grad], output) if keep else None
        ctx.param_wanted = [p.requires_grad for p in own]
        return output.detach().clone(memory_format=torch.contiguous_format) if keep else output.contiguous()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grads = backward_through_graph(ctx, grad, non_tensors=0)
        activations, param_grads = grads[:_INPUTS], iter(grads[_INPUTS:])
        return (*activations, None, None, *(next(param_grads) if w else None for w in ctx.param_wanted))

    @staticmethod
    def infer_shape(node: Any, shapes: list, dtypes: list) -> tuple[list, list]:
        return [shapes[0]], [dtypes[0]]


def _own_params(experts: torch.nn.Module) -> list[torch.nn.Parameter]:
    return list(experts.parameters(recurse=False))


@contextlib.contextmanager
def _holding(own: list[torch.nn.Parameter], gathered: tuple[torch.Tensor, ...]) -> Iterator[None]:
    """The module's parameters hold ORT's gathered values while the block runs where DeepSpeed has them partitioned
    (the layer-wise recompute gathers them for ORT only); each is partitioned again after."""
    swapped = []
    for param, full in zip(own, gathered, strict=True):
        if param.numel() != full.numel():
            swapped.append((param, param.data))
            param.data = full.detach()
    try:
        yield
    finally:
        for param, partitioned in swapped:
            param.data = partitioned


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
            return ExpertsInTorch.apply(*args, experts, implementation, *_own_params(experts))

        return experts_forward

    return get_interface
