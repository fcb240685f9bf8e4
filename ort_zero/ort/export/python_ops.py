"""Torch ops that run in PyTorch from inside the ORT graph, for ops torch's exporter cannot write or ORT 1.19.2 has
no gradient for, where no exact decomposition into ONNX ops with ORT gradients is simple (those are
`export_overrides`). While ORTModule exports a ZeRO-3 model, the torch function is replaced by a call to an autograd
Function whose forward runs the original op and whose backward differentiates it with torch's autograd: the exporter
writes the Function as a PythonOp (com.microsoft) and ORT calls back into PyTorch for it, so ORT never meets the op,
and the values and gradients are torch's own. Each replacement is a patch in the group `export_python_ops`
(ort_zero.patches), applied only while a ZeRO-3 model is exported; PyTorch runs keep torch's functions.

The Functions ORT calls back into at step time are `ort_zero.ort.step.python_ops`; here, the replacements that call
them while a model is exported, and why each op needs one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ...declaration import Declaration
from ..step.python_ops import Exponential, ScatterReduce, SolveTriangular, Uniform


def _solve_triangular(replaced: Callable[..., Any]) -> Callable[..., Any]:
    def solve_triangular(a: torch.Tensor, b: torch.Tensor, *, upper: bool, left: bool = True, **rest: Any) -> Any:
        unitriangular = rest.pop("unitriangular", False)
        if rest:  # out=
            return replaced(a, b, upper=upper, left=left, unitriangular=unitriangular, **rest)
        return SolveTriangular.apply(a, b, upper, left, unitriangular)

    return solve_triangular


def _scatter_reduce(replaced: Callable[..., Any]) -> Callable[..., Any]:
    def scatter_reduce(
        self: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor, reduce: str, **rest: Any
    ) -> Any:
        include_self = rest.pop("include_self", True)
        if rest or (include_self and reduce != "mean"):  # out=, or a form torch's exporter writes
            return replaced(self, dim, index, src, reduce, include_self=include_self, **rest)
        return ScatterReduce.apply(self, index, src, int(dim), str(reduce), bool(include_self))

    return scatter_reduce


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
