"""A 16-bit model's SiLU and its products of like tensors as torch's kernels inside ORT's graph, on the CPU.

ORT 1.19.2's CPU provider has no bf16 or fp16 kernel for Mul or for the QuickGelu it fuses SiLU into, so
`passes.half_precision_casts` runs them in float32 between Casts. The largest such ops of a LLaMA-shaped model are
its MLP's `act_fn(gate) * up` ([seq, intermediate]): at 162M, seq 1024, bf16, that Mul, the SiLU, their gradients
and their 14 Casts per layer took 1.2 s of an 18 s step (ORT's profiler, 2026-11-29), where torch computes them in
bf16. While a 16-bit ZeRO-3 model is exported on the CPU, `F.silu` runs as `SiluInTorch` and `a * b` of two tensors
of one shape and dtype as `ProductInTorch`: PythonOps whose forward and backward are torch's kernels, the values
native ZeRO-3 computes (torch's bf16 kernels compute in float32 and round once, as ORT's Casts did). Each keeps what
ORT's own op kept for its gradient (the SiLU's input, both factors). Products with broadcasting (a norm's weight,
rotary embeddings: small, or float32) and float32 models keep ORT's ops.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ...hooks.export_mode import is_exporting
from .context import wanted_grads
from .devices import faster_in_torch

_SIXTEEN_BIT = (torch.bfloat16, torch.float16)


class ProductInTorch(torch.autograd.Function):
    """`left * right` for tensors of one shape and dtype."""

    @staticmethod
    def forward(ctx: Any, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
        wanted = wanted_grads(ctx, left, right)
        keep = any(wanted) and not is_exporting()  # the trace's forward has no backward
        # copies of what the other factor's gradient reads: ORT reuses its inputs' buffers after its forward
        ctx.kept = (
            left.detach().clone() if keep and wanted[1] else None,
            right.detach().clone() if keep and wanted[0] else None,
        )
        return torch.mul(left, right)  # torch.mul: `*` is the patched one while exported

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        left, right = ctx.kept
        ctx.kept = None
        left_grad = torch.mul(grad, right) if ctx.needs_input_grad[0] else None
        right_grad = torch.mul(grad, left) if ctx.needs_input_grad[1] else None
        return left_grad, right_grad

    @staticmethod
    def infer_shape(node: Any, shapes: list, dtypes: list) -> tuple[list, list]:
        """The factors' shape and type."""
        return [shapes[0]], [dtypes[0]]


class SiluInTorch(torch.autograd.Function):
    """`F.silu(input)`."""

    @staticmethod
    def forward(ctx: Any, input: torch.Tensor) -> torch.Tensor:
        keep = wanted_grads(ctx, input)[0] and not is_exporting()  # the trace's forward has no backward
        ctx.kept = input.detach().clone() if keep else None  # ORT reuses its input's buffer after its forward
        return torch.ops.aten.silu(input)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        input, ctx.kept = ctx.kept, None
        return torch.ops.aten.silu_backward(grad, input)

    @staticmethod
    def infer_shape(node: Any, shapes: list, dtypes: list) -> tuple[list, list]:
        """The input's shape and type."""
        return [shapes[0]], [dtypes[0]]


def silu_in_torch(replaced: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """The patch's factory for `F.silu`: `SiluInTorch` for a 16-bit tensor on a device where torch's kernel was
    measured faster (`devices`); torch's own for the rest and for an in-place call."""

    def silu(input: torch.Tensor, inplace: bool = False) -> torch.Tensor:
        if not inplace and isinstance(input, torch.Tensor) and _sixteen_bit_here(input):
            return SiluInTorch.apply(input)
        return replaced(input, inplace)

    return silu


def product_in_torch(replaced: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """The patch's factory for `Tensor.__mul__`: `ProductInTorch` for two 16-bit tensors of one shape and dtype on a
    device where torch's kernel was measured faster (`devices`); every other product is torch's own."""

    def __mul__(self: torch.Tensor, other: Any) -> torch.Tensor:
        if _same_shape_16_bit(self, other):
            return ProductInTorch.apply(self, other)
        return replaced(self, other)

    return __mul__


def _sixteen_bit_here(tensor: torch.Tensor) -> bool:
    return tensor.dtype in _SIXTEEN_BIT and faster_in_torch(tensor) and not tensor.is_nested


def _same_shape_16_bit(left: torch.Tensor, right: Any) -> bool:
    return (
        isinstance(right, torch.Tensor) and _sixteen_bit_here(left) and right.dtype == left.dtype
        and right.shape == left.shape and right.device == left.device and not right.is_nested
    )  # fmt: skip
