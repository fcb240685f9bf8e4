"""A module's own forward run by torch inside ORT's graph, on the module's own ZeRO-3 parameters (the runtime of
`ExpertsInTorch` and `LinearInTorch`).

The module's parameters are the PythonOp's inputs, so that ORT reads them from the module's pre-forward bridge and
hands their gradients to DeepSpeed as for any module; but the kept graph saves the module's own ZeRO-3 parameters,
not ORT's gathered copies: DeepSpeed releases them after the forward and gathers them again before the module's
backward (its post-forward bridge), as in native ZeRO-3, so no step holds every layer's weights gathered. Where
DeepSpeed has them partitioned while the forward runs (the layer-wise recompute gathers them for ORT only), they hold
ORT's gathered values for the call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ....hooks.export_mode import is_exporting
from ..kept_graph import backward_through_graph


def own_params(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    return list(module.parameters(recurse=False))


def forward_on_own_params(
    ctx: Any,
    module: torch.nn.Module,
    run: Callable[..., torch.Tensor],
    inputs: tuple[torch.Tensor, ...],
    gathered: tuple[torch.Tensor, ...],
) -> torch.Tensor:
    """`run(module, *inputs)` by torch with autograd on, its graph kept in `ctx` for `backward_on_own_params`. The
    inputs are copied when the graph is kept (ORT reuses their buffers after the forward; the graph reads them)."""
    own = own_params(module)
    wanted = [w and t.is_floating_point() for t, w in zip(inputs, ctx.needs_input_grad, strict=False)]
    keep = any(ctx.needs_input_grad) and not is_exporting()  # the trace's forward has no backward
    with torch.set_grad_enabled(keep), _holding(own, gathered):  # no graph where none is kept
        copies = [
            (t.detach().clone() if keep else t.detach()).requires_grad_(w) for t, w in zip(inputs, wanted, strict=True)
        ]
        output = run(module, *copies)
    ctx.graph = (copies + [p for p in own if p.requires_grad], output) if keep else None
    ctx.param_wanted = [p.requires_grad for p in own]
    # ORT may ask for a frozen parameter's gradient too (an input on a differentiable path): zeros, what None means
    asked = ctx.needs_input_grad[len(ctx.needs_input_grad) - len(own) :]
    ctx.frozen_asked = [
        (g.shape, g.dtype) if a and not p.requires_grad else None for p, g, a in zip(own, gathered, asked, strict=True)
    ]
    # ORT gets the output's storage, not a copy: neither a matmul's backward nor the experts' reads its output's
    # values, so a buffer ORT reuses after the forward changes nothing the backward needs, and no output is held twice
    return output.detach().contiguous()


def backward_on_own_params(ctx: Any, grad: torch.Tensor, inputs: int, non_tensors: int) -> tuple[Any, ...]:
    """The gradients of the forward's `inputs` tensors, None for its `non_tensors` arguments, then the parameters'."""
    grads = backward_through_graph(ctx, grad, non_tensors=0)
    activations, param_grads = grads[:inputs], iter(grads[inputs:])
    params: list[torch.Tensor | None] = []
    for wanted, frozen in zip(ctx.param_wanted, ctx.frozen_asked, strict=True):
        if wanted:
            params.append(next(param_grads))
        else:
            params.append(None if frozen is None else torch.zeros(frozen[0], dtype=frozen[1], device=grad.device))
    return (*activations, *([None] * non_tensors), *params)


@contextlib.contextmanager
def _holding(own: list[torch.nn.Parameter], gathered: tuple[torch.Tensor, ...]) -> Iterator[None]:
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
