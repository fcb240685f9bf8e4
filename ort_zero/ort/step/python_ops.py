"""Torch ops that run in PyTorch from inside ORT's graph, as autograd Functions ORT calls back into: for ops torch's
exporter cannot write or ORT 1.19.2 has no gradient for (which ones, and why: `ort_zero.ort.export.python_ops`,
where the export writes a call to one of these instead of the op). Their forwards run the original op, their
backwards differentiate it with torch's autograd (`kept_graph`), and the random ones draw from torch's generator.
Non-tensor arguments (bools, floats) are recorded in the PythonOp's attributes by ORT's exporter and given back to
the forward as they were.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

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
