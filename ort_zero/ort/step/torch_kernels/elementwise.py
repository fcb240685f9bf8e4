"""A 16-bit model's SiLU, products, sums and negations of activations as torch's kernels inside ORT's graph, on the
CPU.

ORT 1.19.2's CPU provider has no bf16 or fp16 kernel for Mul, Add, Neg or the QuickGelu it fuses SiLU into, so
`passes.half_precision_casts` runs them in float32 between Casts. The largest such ops of a LLaMA-shaped model are
its MLP's `act_fn(gate) * up` ([seq, intermediate]): at 162M, seq 1024, bf16, that Mul, the SiLU, their gradients
and their 14 Casts per layer took 1.2 s of an 18 s step (ORT's profiler, 2026-11-29), where torch computes them in
bf16; then the rotary embedding's products and sums and the residual sums ([seq, hidden]), 0.5 s, and the rotary
embedding's negations and their Casts, 0.07 s of a 6 s step (2026-12-01). While a 16-bit ZeRO-3 model is exported on
the CPU, `F.silu` runs as `SiluInTorch`, `a * b` and `a + b` of two tensors of one dtype, neither a parameter, as
`ProductInTorch` and `SumInTorch`, and `-a` of such a tensor as `NegationInTorch`: PythonOps whose forward and
backward are torch's kernels, the values native ZeRO-3 computes (torch's bf16 kernels compute in float32 and round
once, as ORT's Casts did). Each keeps what ORT's own op kept for its gradient (the SiLU's input, the factors; a sum
and a negation keep nothing). A product with a parameter (a norm's `weight * x` where ORT's fused norm stays) and
float32 models keep ORT's ops. Their outputs, gradients and kept copies come from the output pool (`output_pool`), as
the linear layers' do: left to torch, a bf16 162M LLaMA's forward at seq 2048 faulted them in again every step
(about 90 MiB a layer).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ....hooks.export_mode import is_exporting
from ....memory.output_pool import pooled, pooled_copy
from .context import wanted_grads
from .devices import faster_in_torch

_SIXTEEN_BIT = (torch.bfloat16, torch.float16)


class ProductInTorch(torch.autograd.Function):
    """`left * right` for tensors of one dtype (broadcast: each gradient summed to its factor's shape)."""

    @staticmethod
    def forward(ctx: Any, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
        wanted = wanted_grads(ctx, left, right)
        keep = any(wanted) and not is_exporting()  # the trace's forward has no backward
        # copies of what the other factor's gradient reads: ORT reuses its inputs' buffers after its forward
        ctx.kept = (
            pooled_copy(left) if keep and wanted[1] else None,
            pooled_copy(right) if keep and wanted[0] else None,
        )
        ctx.shapes = (left.shape, right.shape)
        return into_pool(torch.mul, left, right)  # torch.mul: `*` is the patched one while exported

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        (left, right), (left_shape, right_shape) = ctx.kept, ctx.shapes
        ctx.kept = None
        left_grad = into_pool(torch.mul, grad, right).sum_to_size(left_shape) if ctx.needs_input_grad[0] else None
        right_grad = into_pool(torch.mul, grad, left).sum_to_size(right_shape) if ctx.needs_input_grad[1] else None
        return left_grad, right_grad

    @staticmethod
    def infer_shape(node: Any, shapes: list, dtypes: list) -> tuple[list, list]:
        """The factors' broadcast shape, their type."""
        return [broadcast_shape(shapes[0], shapes[1])], [dtypes[0]]


class SumInTorch(torch.autograd.Function):
    """`left + right` for tensors of one dtype (broadcast: each gradient summed to its term's shape)."""

    @staticmethod
    def forward(ctx: Any, left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
        wanted_grads(ctx, left, right)
        ctx.shapes = (left.shape, right.shape)
        return into_pool(torch.add, left, right)  # torch.add: `+` is the patched one while exported

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        # copies, not the gradient itself: ORT plans no output of the PythonOp in its input's buffer
        return tuple(
            (pooled_copy(grad) if shape == grad.shape else grad.sum_to_size(shape)) if wanted else None
            for shape, wanted in zip(ctx.shapes, ctx.needs_input_grad, strict=True)
        )

    @staticmethod
    def infer_shape(node: Any, shapes: list, dtypes: list) -> tuple[list, list]:
        """The terms' broadcast shape, their type."""
        return [broadcast_shape(shapes[0], shapes[1])], [dtypes[0]]


def into_pool(op: Callable[..., torch.Tensor], left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """`op(left, right)` (torch.mul, torch.add) into a pool buffer where the pool serves (the shape by
    `broadcast_shape`: torch.broadcast_shapes takes 0.33 ms a call, general for symbolic sizes). The pool never
    serves the export's trace, where a shape's sizes are traced tensors: no shape is asked for there."""
    if is_exporting():
        return op(left, right)
    out = pooled(tuple(broadcast_shape(left.shape, right.shape)), left, right)
    return op(left, right) if out is None else op(left, right, out=out)


def broadcast_shape(left: list, right: list) -> list:
    """The shape two operands broadcast to, of dimensions that are numbers or ORT's symbolic names."""
    rank = max(len(left), len(right))
    left, right = [1] * (rank - len(left)) + list(left), [1] * (rank - len(right)) + list(right)
    return [b if a == 1 else a for a, b in zip(left, right, strict=True)]


class SiluInTorch(torch.autograd.Function):
    """`F.silu(input)`."""

    @staticmethod
    def forward(ctx: Any, input: torch.Tensor) -> torch.Tensor:
        keep = wanted_grads(ctx, input)[0] and not is_exporting()  # the trace's forward has no backward
        ctx.kept = pooled_copy(input) if keep else None  # ORT reuses its input's buffer after its forward
        out = pooled(tuple(input.shape), input)
        return torch.ops.aten.silu(input) if out is None else torch.ops.aten.silu.out(input, out=out)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        input, ctx.kept = ctx.kept, None
        out = pooled(tuple(grad.shape), grad, input)
        if out is None:
            return torch.ops.aten.silu_backward(grad, input)
        return torch.ops.aten.silu_backward.grad_input(grad, input, grad_input=out)

    @staticmethod
    def infer_shape(node: Any, shapes: list, dtypes: list) -> tuple[list, list]:
        """The input's shape and type."""
        return [shapes[0]], [dtypes[0]]


class NegationInTorch(torch.autograd.Function):
    """`-input` (the rotary embedding's `rotate_half`): ORT's CPU Neg is float32 only."""

    @staticmethod
    def forward(ctx: Any, input: torch.Tensor) -> torch.Tensor:
        wanted_grads(ctx, input)
        out = pooled(tuple(input.shape), input)
        return torch.neg(input) if out is None else torch.neg(input, out=out)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        out = pooled(tuple(grad.shape), grad)
        return torch.neg(grad) if out is None else torch.neg(grad, out=out)

    @staticmethod
    def infer_shape(node: Any, shapes: list, dtypes: list) -> tuple[list, list]:
        """The input's shape and type."""
        return [shapes[0]], [dtypes[0]]


def silu_in_torch(replaced: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """The patch's factory for `F.silu`: `SiluInTorch` for a 16-bit tensor on a device where torch's kernel was
    measured faster (`devices`); torch's own for the rest and for an in-place call."""

    def silu(input: torch.Tensor, inplace: bool = False) -> torch.Tensor:
        if not inplace and isinstance(input, torch.Tensor) and is_sixteen_bit_here(input):
            return SiluInTorch.apply(input)
        return replaced(input, inplace)

    return silu


def product_in_torch(replaced: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """The patch's factory for `Tensor.__mul__`: `ProductInTorch` for two activations of one 16-bit dtype on a device
    where torch's kernel was measured faster (`devices`); every other product is torch's own."""

    def __mul__(self: torch.Tensor, other: Any) -> torch.Tensor:
        if _like_activations(self, other):
            return ProductInTorch.apply(self, other)
        return replaced(self, other)

    return __mul__


def sum_in_torch(replaced: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """The patch's factory for `Tensor.__add__`: `SumInTorch` where `product_in_torch` takes a product."""

    def __add__(self: torch.Tensor, other: Any) -> torch.Tensor:
        if _like_activations(self, other):
            return SumInTorch.apply(self, other)
        return replaced(self, other)

    return __add__


def negation_in_torch(replaced: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """The patch's factory for `Tensor.__neg__`: `NegationInTorch` for a 16-bit activation (not a parameter) on a
    device where torch's kernels were measured faster (`devices`); every other negation is torch's own."""

    def __neg__(self: torch.Tensor) -> torch.Tensor:
        if is_sixteen_bit_here(self) and not isinstance(self, torch.nn.Parameter):
            return NegationInTorch.apply(self)
        return replaced(self)

    return __neg__


def is_sixteen_bit_here(tensor: torch.Tensor) -> bool:
    """A 16-bit tensor (not nested) on a device where torch's kernels were measured faster (`devices`)."""
    return tensor.dtype in _SIXTEEN_BIT and faster_in_torch(tensor) and not tensor.is_nested


def _like_activations(left: torch.Tensor, right: Any) -> bool:
    """Two 16-bit tensors of one dtype and device, neither a parameter: a norm's `weight * x` stays ORT's, which fuses
    it into its RMSNorm."""
    return (
        isinstance(right, torch.Tensor) and is_sixteen_bit_here(left) and right.dtype == left.dtype
        and right.device == left.device and not right.is_nested
        and not isinstance(left, torch.nn.Parameter) and not isinstance(right, torch.nn.Parameter)
    )  # fmt: skip
