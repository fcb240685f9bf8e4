"""The speed-only replacements (linear layers, the loss, a 16-bit SiLU, product and sum) apply on the CPU, where they
were measured; on any other device the export keeps ORT's own ops (a meta tensor stands in for a CUDA one: this
machine has no GPU)."""

from __future__ import annotations

import torch

from ort_zero.ort.step.torch_kernels import (
    cross_entropy_in_torch,
    linear_in_torch,
    product_in_torch,
    silu_in_torch,
    sum_in_torch,
)


def _replaced(name: str, calls: list[str]):
    def original(*args, **kwargs):
        calls.append(name)
        return None

    return original


def test_linear_and_loss_keep_orts_ops_off_the_cpu() -> None:
    calls: list[str] = []
    linear = torch.nn.Linear(4, 4, device="meta")
    linear_in_torch(_replaced("linear", calls))(linear, torch.empty(2, 4, device="meta"))
    logits, target = torch.empty(2, 4, device="meta"), torch.zeros(2, dtype=torch.int64, device="meta")
    cross_entropy_in_torch(_replaced("loss", calls))(logits, target)
    half = torch.empty(2, 4, dtype=torch.bfloat16, device="meta")
    silu_in_torch(_replaced("silu", calls))(half)
    product_in_torch(_replaced("mul", calls))(half, half)
    sum_in_torch(_replaced("add", calls))(half, half)
    assert calls == ["linear", "loss", "silu", "mul", "add"]


def test_on_the_cpu_torch_runs_them() -> None:
    calls: list[str] = []
    linear = torch.nn.Linear(4, 4)
    out = linear_in_torch(_replaced("linear", calls))(linear, torch.randn(2, 4))
    loss = cross_entropy_in_torch(_replaced("loss", calls))(torch.randn(2, 4), torch.zeros(2, dtype=torch.int64))
    assert calls == [] and out.shape == (2, 4) and loss.dim() == 0
