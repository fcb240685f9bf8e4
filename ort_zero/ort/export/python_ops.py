"""Torch ops that run in PyTorch from inside the ORT graph, for ops torch's exporter cannot write or ORT 1.19.2 has
no gradient for, where no exact decomposition into ONNX ops with ORT gradients is simple (those are
`export_overrides`). While ORTModule exports a ZeRO-3 model, the torch function is replaced by a call to an autograd
Function whose forward runs the original op and whose backward differentiates it with torch's autograd: the exporter
writes the Function as a PythonOp (com.microsoft) and ORT calls back into PyTorch for it, so ORT never meets the op,
and the values and gradients are torch's own. Each replacement is a patch in the group `export_python_ops`
(ort_zero.patches), applied only while a ZeRO-3 model is exported; PyTorch runs keep torch's functions.

The Functions keep torch's own graph for their backward (`kept_graph`). Non-tensor arguments (bools, floats) are
recorded in the PythonOp's attributes by ORT's exporter and given back to the forward as they were.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ...declaration import Declaration
from ...hooks.export_mode import is_exporting
from .kept_graph import backward_through_graph, forward_keeping_graph


def _broadcast(first: list, second: list) -> list:
    """Batch dimensions broadcast as torch does, on ORT's shapes (ints or symbolic names)."""
    width = max(len(first), len(second))
    first, second = [1] * (width - len(first)) + first, [1] * (width - len(second)) + second
    return [b if a == 1 else a for a, b in zip(first, second, strict=True)]


class SolveTriangular(torch.autograd.Function):
    """`torch.linalg.solve_triangular(a, b, upper=, left=, unitriangular=)`, run by torch."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor, upper: bool, left: bool, unitriangular: bool) -> Any:
        def solve(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return torch.ops.aten.linalg_solve_triangular(a, b, upper=upper, left=left, unitriangular=unitriangular)

        return forward_keeping_graph(ctx, solve, (a, b))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return backward_through_graph(ctx, grad, non_tensors=3)

    @staticmethod
    def infer_shape(node: Any, shapes: list, dtypes: list) -> tuple[list, list]:
        """B's matrix dimensions after the broadcast batch dimensions (the solution has B's shape)."""
        a, b = shapes
        if a is None or b is None:
            return [None], [dtypes[1]]
        return [_broadcast(list(a[:-2]), list(b[:-2])) + list(b[-2:])], [dtypes[1]]


def _solve_triangular(replaced: Callable[..., Any]) -> Callable[..., Any]:
    def solve_triangular(a: torch.Tensor, b: torch.Tensor, *, upper: bool, left: bool = True, **rest: Any) -> Any:
        unitriangular = rest.pop("unitriangular", False)
        if rest:  # out=
            return replaced(a, b, upper=upper, left=left, unitriangular=unitriangular, **rest)
        return SolveTriangular.apply(a, b, upper, left, unitriangular)

    return solve_triangular


class ScatterReduce(torch.autograd.Function):
    """`input.scatter_reduce(dim, index, src, reduce, include_self=)`, run by torch."""

    @staticmethod
    def forward(
        ctx: Any, input: torch.Tensor, index: torch.Tensor, src: torch.Tensor, dim: int, reduce: str, include_self: bool
    ) -> Any:
        def scatter_reduce(input: torch.Tensor, index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
            return torch.ops.aten.scatter_reduce(input, dim, index, src, reduce, include_self=include_self)

        return forward_keeping_graph(ctx, scatter_reduce, (input, index, src))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return backward_through_graph(ctx, grad, non_tensors=3)

    @staticmethod
    def infer_shape(node: Any, shapes: list, dtypes: list) -> tuple[list, list]:
        return [shapes[0]], [dtypes[0]]


def _scatter_reduce(replaced: Callable[..., Any]) -> Callable[..., Any]:
    def scatter_reduce(
        self: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor, reduce: str, **rest: Any
    ) -> Any:
        include_self = rest.pop("include_self", True)
        if rest or (include_self and reduce != "mean"):  # out=, or a form torch's exporter writes
            return replaced(self, dim, index, src, reduce, include_self=include_self, **rest)
        return ScatterReduce.apply(self, index, src, int(dim), str(reduce), bool(include_self))

    return scatter_reduce


def _draw(sample: Callable[[], torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """`sample()` from torch's default generator; while the model is traced, from a copy of its state (the trace's
    values are not kept), so that an ORT run draws the same numbers as PyTorch at the same point of each step."""
    if not is_exporting():
        return sample()
    with torch.random.fork_rng(devices=[like.device] if like.device.type == "cuda" else []):
        return sample()


class Exponential(torch.autograd.Function):
    """Samples of the exponential distribution shaped like `x`, drawn by torch (`_draw`)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, lambd: float) -> torch.Tensor:
        return _draw(lambda: torch.ops.aten.exponential(x, lambd), x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None]:
        return None, None  # the samples do not depend on x's values

    @staticmethod
    def infer_shape(node: Any, shapes: list, dtypes: list) -> tuple[list, list]:
        return shapes, dtypes


class Uniform(torch.autograd.Function):
    """Samples of the uniform distribution on [low, high) shaped like `x`, drawn by torch (`_draw`)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, low: float, high: float) -> torch.Tensor:
        return _draw(lambda: torch.ops.aten.uniform(x, low, high), x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None, None]:
        return None, None, None

    @staticmethod
    def infer_shape(node: Any, shapes: list, dtypes: list) -> tuple[list, list]:
        return shapes, dtypes


# The stand-ins use what the op returns: an ONNX graph has no in-place write to a value, so the sampling ops' in-place
# forms return new tensors (PhiMoE's `empty_like(...).exponential_().log()` uses the result). Calls with arguments
# the stand-ins do not take go to torch's own function.


def _exponential_(replaced: Callable[..., Any]) -> Callable[..., Any]:
    def exponential_(self: torch.Tensor, lambd: float = 1.0, *, generator: torch.Generator | None = None) -> Any:
        if generator is not None:
            return replaced(self, lambd, generator=generator)
        return Exponential.apply(self, float(lambd))

    return exponential_


def _uniform_(replaced: Callable[..., Any]) -> Callable[..., Any]:
    def uniform_(self: torch.Tensor, from_: float = 0.0, to: float = 1.0, *, generator: Any = None) -> Any:
        if generator is not None:
            return replaced(self, from_, to, generator=generator)
        return Uniform.apply(self, float(from_), float(to))

    return uniform_


def _rand_like(replaced: Callable[..., Any]) -> Callable[..., Any]:
    def rand_like(input: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs or not input.is_floating_point():
            return replaced(input, *args, **kwargs)
        return Uniform.apply(input, 0.0, 1.0)  # torch's rand_like is empty_like(input).uniform_(0, 1)

    return rand_like


_NO_EXPORT = "torch's exporter has no symbolic for it at any opset"
PYTHON_OPS: tuple[Declaration, ...] = (
    Declaration(
        "torch.linalg_solve_triangular_in_torch",
        "torch.linalg.solve_triangular",
        f"the gated delta rule of Qwen3.5/Qwen3-Next's linear attention solves a triangular system; {_NO_EXPORT} "
        "and ORT has no such kernel: solved by torch in a PythonOp, its gradient by torch's autograd",
        _solve_triangular,
        ("qwen3_5", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_5_text", "qwen3_next", "qwen4_exp", "qwen4_exp_text"),
    ),
    Declaration(
        "torch.tensor_scatter_reduce_in_torch",
        "torch:Tensor.scatter_reduce",
        "BLT's patch embeddings take the maximum of each patch's byte embeddings with scatter_reduce('amax', "
        "include_self=False), which torch's exporter refuses (ONNX's ScatterElements always reduces with the "
        "destination's values, and has max only from opset 18; mean it has not at all), and ORT's ScatterElements "
        "gradient ignores the reduction: reduced by torch in a PythonOp (include_self=False or mean), its gradient "
        "by torch's autograd",
        _scatter_reduce,
        ("blt",),
    ),
    Declaration(
        "torch.tensor_exponential_in_torch",
        "torch:Tensor.exponential_",
        f"PhiMoE's router samples experts in training (Gumbel noise, Tensor.exponential_); {_NO_EXPORT}, and "
        "ORT's random ops draw other numbers than torch's generator: drawn by torch in a PythonOp",
        _exponential_,
        ("phimoe",),
    ),
    Declaration(
        "torch.tensor_uniform_in_torch",
        "torch:Tensor.uniform_",
        f"PhiMoE's router draws with Tensor.uniform_ in training; {_NO_EXPORT}: drawn by torch in a PythonOp",
        _uniform_,
        ("phimoe",),
    ),
    Declaration(
        "torch.rand_like_in_torch",
        "torch.rand_like",
        "PhiMoE's router draws with torch.rand_like in training, which torch exports as RandomUniformLike: ORT would "
        "draw other numbers than torch's generator, and native's losses could not be matched: drawn by torch",
        _rand_like,
        ("phimoe",),
    ),
)
