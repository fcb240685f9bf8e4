"""A 16-bit model's RMSNorm as torch's kernels inside ORT's graph, on the CPU.

ORT's optimizer fuses transformers' RMSNorm into `SimplifiedLayerNormalization`, for which ORT 1.19.2's CPU provider
has float32 kernels only: `passes.half_precision_casts` then runs the norm and its gradient in float32 between
Casts. At 162M, seq 1024, bf16 the fused norms, their gradients and their Casts took 0.3-0.5 s of a 9.5 s step (ORT's
profiler, 2026-11-29), where native ZeRO-3 runs transformers' RMSNorm in torch. While a 16-bit ZeRO-3 model is exported
on the CPU, a norm whose forward is LLaMA's RMSNorm (142 of transformers' 198 RMSNorm classes share its code:
`is_llamas_rms_norm`) runs as `RmsNormInTorch`, a PythonOp whose forward computes what transformers' does, in the same
dtypes and order (the statistics in float32, the normalized rows rounded to the model's dtype, then times the
weight), and whose backward is written out: it keeps only the input (a pool copy: ORT reuses its inputs' buffers
after its forward) and the rows' inverse root mean square, where torch's autograd keeps a float32 copy of the input
and the normalized rows too. Its row-sized temporaries, float32 and 16-bit, are pool buffers as well
(`elementwise.into_pool`; the squares as `x * x`, which is what torch's `pow(x, 2)` computes): fresh, most were
faulted in again in every forward and backward after the heap's trims. Norms of other forms (Gemma's `1 + weight`,
gated and unweighted ones) and float32 models keep ORT's fused norm.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ....hooks.export_mode import is_exporting, is_stand_in
from ....memory.output_pool import pooled, pooled_copy
from .context import wanted_grads
from .elementwise import into_pool, is_sixteen_bit_here

_CODE_CACHE: dict[type, bool] = {}
"""Per module class: whether its forward is LLaMA's RMSNorm (classes live as long as the process)."""


class RmsNormInTorch(torch.autograd.Function):
    """`weight * (x * rsqrt(mean(x^2) + eps)).to(x.dtype)`, the statistics in float32, for `norm`'s input `x` and
    its weight as ORT has it (gathered)."""

    @staticmethod
    def forward(ctx: Any, input: torch.Tensor, norm: torch.nn.Module, weight: torch.Tensor) -> torch.Tensor:
        wanted = wanted_grads(ctx, input, norm, weight)
        ctx.frozen = None if norm.weight.requires_grad else (weight.shape, weight.dtype)
        if is_exporting() and is_stand_in(weight):
            return torch.zeros_like(input)  # the trace records the PythonOp, not what it computed on zeros
        wide = pooled_copy(input, torch.float32)
        inverse_rms = torch.rsqrt(into_pool(torch.mul, wide, wide).mean(-1, keepdim=True) + norm.variance_epsilon)
        normalized = pooled_copy(into_pool(torch.mul, wide, inverse_rms), input.dtype)
        del wide
        # the trace's forward has no backward; the layer-wise recompute's first forward wants no gradient
        keep = any(wanted) and not is_exporting()
        ctx.kept = (pooled_copy(input), inverse_rms, weight.detach().clone()) if keep else None
        out = pooled(tuple(input.shape), input, weight)
        return torch.mul(weight, normalized) if out is None else torch.mul(weight, normalized, out=out)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, torch.Tensor | None]:
        (input, inverse_rms, weight), ctx.kept = ctx.kept, None
        wide = pooled_copy(input, torch.float32)  # changed in place below
        weight_grad = None
        if ctx.needs_input_grad[2]:
            if ctx.frozen is None:
                normalized = pooled_copy(into_pool(torch.mul, wide, inverse_rms), input.dtype)
                weight_grad = into_pool(torch.mul, grad, normalized).sum_to_size(weight.shape)
            else:  # frozen: zeros where ORT asks (what None means)
                weight_grad = torch.zeros(ctx.frozen[0], dtype=ctx.frozen[1], device=grad.device)
        if not ctx.needs_input_grad[0]:
            return None, None, weight_grad
        normalized_grad = pooled_copy(into_pool(torch.mul, grad, weight), torch.float32)
        # d(x * r)/dx with r = (mean(x^2) + eps)^-1/2: r * g - x * r^3 * mean(g * x)
        projection = into_pool(torch.mul, normalized_grad, wide).sum(-1, keepdim=True) * (-0.5) * inverse_rms.pow(3)
        wide_grad = normalized_grad.mul_(inverse_rms).add_(wide.mul_(projection.mul_(2.0 / input.shape[-1])))
        out = pooled(tuple(input.shape), input)
        input_grad = wide_grad.to(input.dtype) if out is None else out.copy_(wide_grad)
        return input_grad, None, weight_grad

    @staticmethod
    def infer_shape(node: Any, shapes: list, dtypes: list) -> tuple[list, list]:
        """The input's shape and type."""
        return [shapes[0]], [dtypes[0]]


def is_llamas_rms_norm(module: torch.nn.Module) -> bool:
    """Whether `module`'s forward is LLaMA's RMSNorm, code for code (transformers copies it into each family that
    uses it), and the module holds what that forward reads: a 1-d `weight` and a `variance_epsilon`."""
    cls = type(module)
    if cls not in _CODE_CACHE:
        _CODE_CACHE[cls] = cls.__name__.endswith("RMSNorm") and _same_code(cls.forward, _llamas_forward())
    weight = getattr(module, "weight", None)
    return (
        _CODE_CACHE[cls] and isinstance(weight, torch.nn.Parameter) and weight.dim() == 1
        and isinstance(getattr(module, "variance_epsilon", None), float) and not any(True for _ in module.children())
    )  # fmt: skip


def _llamas_forward() -> Callable[..., Any]:
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    return LlamaRMSNorm.forward


def _same_code(left: Callable[..., Any], right: Callable[..., Any]) -> bool:
    codes = [getattr(function, "__code__", None) for function in (left, right)]
    if None in codes:
        return False
    return len({(code.co_code, code.co_names, code.co_consts, code.co_varnames) for code in codes}) == 1


def rms_norm_in_torch(replaced: Callable[..., Any]) -> Callable[..., Any]:
    """The patch's factory for `nn.Module._slow_forward` (what a module's call runs while torch traces it): a
    LLaMA-form RMSNorm on one 16-bit input, on a device where torch's kernels were measured faster, runs as
    `RmsNormInTorch`; every other module's call is torch's own."""

    def _slow_forward(self: torch.nn.Module, *input: Any, **kwargs: Any) -> Any:
        if (
            not kwargs and len(input) == 1 and isinstance(input[0], torch.Tensor)
            and is_sixteen_bit_here(input[0]) and is_llamas_rms_norm(self) and self.weight.dtype == input[0].dtype
        ):  # fmt: skip
            return RmsNormInTorch.apply(input[0], self, self.weight)
        return replaced(self, *input, **kwargs)

    return _slow_forward
