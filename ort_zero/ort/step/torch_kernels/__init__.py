"""Computations ORT runs as torch's own kernels, inside its graph, where ONNX ops would cost memory or cannot express
them: attention (`attention`: torch's fused scaled-dot-product kernel), mixture-of-experts blocks (`experts`: the
experts implementation a model picks, grouped matmuls for transformers' default), and on the CPU, where they were
measured faster (`devices`), linear layers (`linear`: torch's matmuls), the loss (`cross_entropy`: torch's, 3x
faster than ORT's), a 16-bit model's SiLU, products, sums and negations (`elementwise`: ORT has no 16-bit kernels)
and its RMSNorms (`norms`: ORT's fused norm is float32 only); experts and linear layers run on their module's own
ZeRO-3 parameters (`modules`). Each is a PythonOp replacement applied while a ZeRO-3 model is exported
(ort_zero.patches); those in a layer may be run again by the layer-wise recompute (`RECOMPUTABLE`): what each keeps
for its backward is its kernel's own state, which the recompute re-creates in the backward instead of keeping it from
the forward.
"""

from __future__ import annotations

from ....python_op import function_name
from .attention import ScaledDotProductAttention, draws_dropout, sdpa_in_torch
from .cross_entropy import CrossEntropyInTorch, cross_entropy_in_torch
from .elementwise import (
    NegationInTorch,
    ProductInTorch,
    SiluInTorch,
    SumInTorch,
    negation_in_torch,
    product_in_torch,
    silu_in_torch,
    sum_in_torch,
)
from .experts import ExpertsInTorch, experts_in_torch
from .failures import raising_kernel_failure
from .linear import LinearInTorch, linear_in_torch
from .norms import RmsNormInTorch, rms_norm_in_torch

__all__ = [
    "RECOMPUTABLE", "UNCHECKED", "CrossEntropyInTorch", "ExpertsInTorch", "LinearInTorch", "NegationInTorch",
    "ProductInTorch", "RmsNormInTorch", "ScaledDotProductAttention", "SiluInTorch", "SumInTorch",
    "cross_entropy_in_torch", "draws_dropout", "experts_in_torch", "linear_in_torch", "negation_in_torch",
    "product_in_torch", "raising_kernel_failure", "rms_norm_in_torch", "sdpa_in_torch", "silu_in_torch",
    "sum_in_torch",
]  # fmt: skip

RECOMPUTABLE = frozenset(
    {
        function_name(ScaledDotProductAttention), function_name(ExpertsInTorch), function_name(LinearInTorch),
        function_name(ProductInTorch), function_name(SiluInTorch), function_name(SumInTorch),
        function_name(RmsNormInTorch), function_name(NegationInTorch),
    }
)  # fmt: skip
"""The PythonOps the layer-wise recompute may copy into the backward (their forward has no side effect)."""

UNCHECKED = RECOMPUTABLE | {function_name(CrossEntropyInTorch)}
"""The PythonOps ORT runs without its safety copies (`passes.unchecked_kernels`): none changes or returns an input."""
