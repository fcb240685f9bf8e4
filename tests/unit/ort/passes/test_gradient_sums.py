"""The gradient_sums pass: on the CPU, the Sum ORT's backward adds a bf16 value's gradients with runs as torch's adds
in a PythonOp (no float32 Sum between Casts), with PyTorch's values; the scalar zero of an output PyTorch gives no
gradient adds nothing; float32 graphs keep ORT's Sum."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from ort_zero.ort.step.functions import SumOfGradients

from ..conftest import Op

SUM_OP = "ort_zero.ort.step.functions.SumOfGradients"


def shared(hidden: torch.Tensor) -> torch.Tensor:
    """A value read by two nodes (a product and a sum), so its gradient is a sum of two."""
    return hidden * hidden.sum(-1, keepdim=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_16_bit_gradient_sum_runs_in_torch(trains_as_pytorch: Callable, dtype: torch.dtype) -> None:
    record = trains_as_pytorch(lambda: Op(shared), dtype=dtype)
    sixteen = dtype == torch.bfloat16
    assert (SUM_OP in record["python_ops"]) == sixteen
    assert "Sum" not in record["float32_fallbacks"], record["float32_fallbacks"]


def test_the_sum_adds_in_order_skips_the_scalar_zero_and_returns_no_input() -> None:
    grads = [torch.randn(4, 8, dtype=torch.bfloat16) for _ in range(3)]
    total = SumOfGradients.forward(None, 3, *grads)
    assert torch.equal(total, grads[0] + grads[1] + grads[2])  # rounded after each add, as autograd accumulates
    zero = torch.zeros((), dtype=torch.bfloat16)
    alone = SumOfGradients.forward(None, 2, grads[0], zero)
    assert torch.equal(alone, grads[0]) and alone.data_ptr() != grads[0].data_ptr()
    one = torch.ones((), dtype=torch.bfloat16)  # a scalar the caller gave is added
    assert torch.equal(SumOfGradients.forward(None, 2, grads[0], one), grads[0] + 1)
    scalars = SumOfGradients.forward(None, 2, zero, one)
    assert scalars.dim() == 0 and float(scalars) == 1.0
