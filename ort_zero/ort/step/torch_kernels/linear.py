"""Linear layers as torch's matmuls inside ORT's graph.

ORT 1.19.2's CPU MatMul (MLAS) takes 1.26x torch's time for a LLaMA-160M MLP's [1024, 768] x [768, 3072] and 1.34x
for its LM head's [1024, 768] x [768, 32000] (one thread each, measured 2026-11-26), and at long sequences a step is
matmuls: ORT-ZeRO3's step at seq 1024 took 1.26x native's. While a ZeRO-3 model is exported, `nn.Linear.forward`
runs as `LinearInTorch`, a PythonOp whose forward and backward are torch's matmuls, as DeepSpeed's own ZeRO-3 linear
runs in torch. The layer-wise recompute re-runs it like the rest of a layer (the forward's call then keeps nothing).

While a ZeRO-3 model is traced for its export, its partitioned weights are stand-ins of zeros
(`ort.export.context`): a layer's output is then its bias, or zeros, and the trace records the PythonOp, not what
it computed; so the trace's matmuls are not run (at seq 1024 on a 162M LLaMA, the trace's forward computed
280 GFLOP of them on zeros: the export took 4.7 s, without them 3.1-3.3 s).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from ....hooks.export_mode import is_exporting, is_stand_in
from ....memory.output_pool import pooled, pooled_copy
from .bits import same_bits
from .context import wanted_grads
from .devices import faster_in_torch


class LinearInTorch(torch.autograd.Function):
    """`F.linear(input, weight, bias)` by torch's matmuls, its backward written out: it keeps a copy of the input
    for the weight's gradient (`_SharedCopy`) and reads the weight from the module in the backward, where DeepSpeed
    has gathered it again (the module's post-forward bridge), so nothing of the forward's gathered weight is held.
    `params` are the module's weight and bias as ORT has them (gathered), in `linear_params` order."""

    @staticmethod
    def forward(
        ctx: Any,
        input: torch.Tensor,
        linear: torch.nn.Module,
        *params: torch.Tensor,
    ) -> torch.Tensor:
        wanted = wanted_grads(ctx, input, linear, *params)
        names = [name for name, _ in _named_linear_params(linear)]
        gathered = dict(zip(names, params, strict=True))
        ctx.linear = linear
        ctx.params = [(p, g.shape, g.dtype) for p, g in zip(linear_params(linear), params, strict=True)]
        # no backward reads this call's context: the export's trace, or the forward of a layer the layer-wise
        # recompute runs again for its backward (ORT runs it without autograd: no input wants a gradient)
        keep = linear.weight.requires_grad and any(wanted) and not is_exporting()
        ctx.input = _SharedCopy.of(input) if keep else None
        if is_exporting() and is_stand_in(gathered["weight"]):
            return _output_of_zeros(input, gathered["weight"], gathered.get("bias"))
        return _linear(input, gathered["weight"], gathered.get("bias"))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        weight = ctx.linear.weight
        rows = grad.reshape(-1, grad.shape[-1])
        input_grad = _matmul_into_pool(rows, weight).view(*grad.shape[:-1], -1) if ctx.needs_input_grad[0] else None
        param_grads = []
        for (param, shape, dtype), asked in zip(ctx.params, ctx.needs_input_grad[2:], strict=True):
            if param is weight and param.requires_grad:
                param_grads.append(rows.t() @ ctx.input.reshape(-1, ctx.input.shape[-1]))
            elif param.requires_grad:  # the bias
                param_grads.append(rows.sum(0))
            else:  # frozen: zeros where ORT asks (what None means)
                param_grads.append(torch.zeros(shape, dtype=dtype, device=grad.device) if asked else None)
        ctx.input = ctx.linear = None
        return (input_grad, None, *param_grads)

    @staticmethod
    def infer_shape(node: Any, shapes: list, dtypes: list) -> tuple[list, list]:
        """The input's shape with the weight's output size."""
        input, weight = shapes[0], shapes[1]
        if input is None or weight is None:
            return [None], [dtypes[0]]
        return [list(input[:-1]) + [weight[0]]], [dtypes[0]]


def _linear(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`F.linear` into a buffer of the output pool (`output_pool`), where it serves."""
    rows = input.reshape(-1, input.shape[-1])
    operands = (rows, weight) if bias is None else (rows, weight, bias)
    out = pooled((rows.shape[0], weight.shape[0]), *operands)
    if out is None:
        return torch.nn.functional.linear(input, weight, bias)
    if bias is None:
        torch.mm(rows, weight.t(), out=out)
    else:
        torch.addmm(bias, rows, weight.t(), out=out)
    return out.view(*input.shape[:-1], weight.shape[0])


def _matmul_into_pool(rows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`rows @ weight` (the input's gradient) into a buffer of the output pool, where it serves."""
    out = pooled((rows.shape[0], weight.shape[1]), rows, weight)
    return rows @ weight if out is None else torch.mm(rows, weight, out=out)


def _output_of_zeros(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`F.linear(input, weight, bias)` for a weight of zeros, without the matmul: the bias in every row (or zeros), in
    the dtype torch's would have (autocast's where it is on: asked of a linear over no rows)."""
    no_rows = torch.nn.functional.linear(input.reshape(-1, input.shape[-1])[:0], weight, bias)
    shape = (*input.shape[:-1], weight.shape[0])
    if bias is None:
        return torch.zeros(shape, dtype=no_rows.dtype, device=input.device)
    return bias.to(no_rows.dtype).expand(shape).clone()


def _named_linear_params(linear: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    return [(name, p) for name, p in linear.named_parameters(recurse=False) if name in ("weight", "bias")]


def linear_params(linear: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The weight and the bias (if any) `F.linear` reads: a subclass's other parameters (a logit scale its own
    forward applies after the linear, as Dory's LM head) are not the kernel's."""
    return [p for _, p in _named_linear_params(linear)]


class _SharedCopy:
    """The copy of an input a linear layer keeps for its weight's gradient, shared with the next linear layer that
    reads the same values (a layer's q, k and v projections, its gate and up projections: one copy where each kept
    its own, 108 MiB per rank on a 162M LLaMA at seq 1024). The last copy is found by where ORT's input lives, and
    reused only while it is alive and has the input's bits (ORT may have reused that memory for another tensor).
    Copies are made into the output pool's buffers: a fresh one faulted its pages in every step (the down
    projection's [2048, 3072] input took 55-61 ms a copy, from the pool 4-5 ms; 162M LLaMA)."""

    _last: tuple[tuple, weakref.ref] | None = None

    @classmethod
    def of(cls, input: torch.Tensor) -> torch.Tensor:
        key = (input.data_ptr(), input.shape, input.stride(), input.dtype, input.device)
        if cls._last is not None and cls._last[0] == key:
            copy = cls._last[1]()
            if copy is not None and same_bits(copy, input):
                return copy
        copy = pooled_copy(input)
        cls._last = (key, weakref.ref(copy))
        return copy


def linear_in_torch(replaced: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """The patch's factory for `nn.Linear.forward`: `LinearInTorch` for a floating-point input on a device where it
    was measured faster (`devices`), `replaced` (ORT's own ops) for the rest."""

    def forward(self: torch.nn.Module, input: torch.Tensor) -> torch.Tensor:
        if not isinstance(input, torch.Tensor) or not input.is_floating_point() or input.is_nested:
            return replaced(self, input)
        if not faster_in_torch(input):
            return replaced(self, input)
        return LinearInTorch.apply(input, self, *linear_params(self))

    return forward
