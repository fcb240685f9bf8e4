"""Linear layers as torch's matmuls inside ORT's graph.

ORT 1.19.2's CPU MatMul (MLAS) takes 1.26x torch's time for a LLaMA-160M MLP's [1024, 768] x [768, 3072] and 1.34x
for its LM head's [1024, 768] x [768, 32000] (one thread each, measured 2026-11-26), and at long sequences a step is
matmuls: ORT-ZeRO3's step at seq 1024 took 1.26x native's. While a ZeRO-3 model is exported, `nn.Linear.forward`
runs as `LinearInTorch`, a PythonOp whose forward and backward are torch's, on the module's own ZeRO-3 parameters
(`modules`), as DeepSpeed's own ZeRO-3 linear runs in torch. The layer-wise recompute re-runs it like the rest of a
layer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .modules import backward_on_own_params, forward_on_own_params, own_params


class LinearInTorch(torch.autograd.Function):
    """`forward(linear, input)` (nn.Linear's own) run by torch; `params` are the module's own parameters as ORT has
    them (gathered)."""

    @staticmethod
    def forward(
        ctx: Any,
        input: torch.Tensor,
        linear: torch.nn.Module,
        forward: Callable[..., torch.Tensor],
        *params: torch.Tensor,
    ) -> torch.Tensor:
        return forward_on_own_params(ctx, linear, forward, (input,), params)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return backward_on_own_params(ctx, grad, inputs=1, non_tensors=2)

    @staticmethod
    def infer_shape(node: Any, shapes: list, dtypes: list) -> tuple[list, list]:
        """The input's shape with the weight's output size."""
        input, weight = shapes[0], shapes[1]
        if input is None or weight is None:
            return [None], [dtypes[0]]
        return [list(input[:-1]) + [weight[0]]], [dtypes[0]]


def linear_in_torch(replaced: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """The patch's factory for `nn.Linear.forward`: `LinearInTorch` for a floating-point input, `replaced` for the
    rest."""

    def forward(self: torch.nn.Module, input: torch.Tensor) -> torch.Tensor:
        if not isinstance(input, torch.Tensor) or not input.is_floating_point() or input.is_nested:
            return replaced(self, input)
        return LinearInTorch.apply(input, self, replaced, *own_params(self))

    return forward
