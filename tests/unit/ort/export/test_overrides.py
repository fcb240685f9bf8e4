"""ort_zero's export overrides: each op that torch's exporter writes in a form ORT rejects (or not at all) trains in
ORT with PyTorch's values and gradients; without ort_zero's patches (a fresh ORTModule re-registers ORT's own
symbolics) the same model fails, so the override is what makes it run."""

from __future__ import annotations

import importlib
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import ort_zero  # noqa: E402, F401, I001  (before ORT: makes ORTModule importable on today's torch)
from ort_zero.ort.export import overrides as export_overrides

from ..conftest import Op

ortmodule = importlib.import_module("onnxruntime.training.ortmodule")


CASES = {
    "aten::layer_norm": lambda x: F.layer_norm(x, (8,)),  # OLMo's LayerNorm: no weight, no bias
    "aten::expm1": torch.expm1,
    "aten::softplus": lambda x: F.softplus(3.0 * x, beta=2.0),
    "aten::rms_norm": lambda x: F.rms_norm(x, (8,)),
    "aten::cumsum": lambda x: x * (x > 0).cumsum(-1),  # Llama 4's attention mask counts booleans
    # Cohere's rotary embedding, then a view with -1: the tracer pools the two -1s into one constant
    "aten::repeat_interleave": lambda x: torch.repeat_interleave(x[:, :4], 2, dim=-1) * x.view(4, -1, 2).flatten(-2),
    # Granite SWA's attention sinks
    "aten::logsumexp": lambda x: x * torch.sigmoid(torch.logsumexp(x, dim=-1) - 1.0).unsqueeze(-1),
    "aten::permute": lambda x: x.view(4, 2, 4).permute(0, -1, 1).reshape(4, 8),  # the Mamba-2 mixers' negative dims
    "aten::diff": lambda x: torch.diff(x, n=2, dim=-1, prepend=x[:, :1], append=x[:, -1:]),
    "aten::linalg_vector_norm": lambda x: x / torch.norm(x, p=1, dim=-1, keepdim=True),  # DBRX's router
    "aten::unflatten": lambda x: (x.unflatten(-1, (2, 4)) * x[:, :2].unsqueeze(-1)).flatten(1),  # Qwen4-Exp
    # TRL's is_top1: a bool tensor masked (ORT's CPU Where has no bool kernel)
    "aten::masked_fill": lambda x: x * (x > 0).masked_fill(x < 0.5, 0),
    "aten::einsum": lambda x: _einsums(x),  # XLNet's one-operand transpose; ellipsis, implicit output, 3 operands
}


def _einsums(x: torch.Tensor) -> torch.Tensor:
    heads = x.view(4, 2, 4)
    transposed = torch.einsum("ibn->nbi", heads).reshape(8, 4).t()
    batched = torch.einsum("...ij,...kj", heads, heads)  # (4, 2, 2): the implicit output "...ik"
    chained = torch.einsum("bi,ij,bj->b", x, x.t() @ x, x)
    summed = torch.einsum("bnd->bd", heads)
    return transposed + batched.reshape(4, 4).repeat(1, 2) + chained[:, None] + summed.repeat(1, 2)


def test_every_override_is_tested_here() -> None:
    assert {override.target for override in export_overrides.OVERRIDES} == set(CASES)


@pytest.mark.parametrize("op", CASES)
def test_override_trains_in_ort_as_pytorch(trains_as_pytorch: Callable[..., None], op: str) -> None:
    trains_as_pytorch(lambda: Op(CASES[op]))


@pytest.mark.parametrize("op", CASES)
def test_without_the_override_ort_cannot_train_it(op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """ORT's own symbolics, registered again by a fresh ORTModule without ort_zero's patch (what the overrides are
    for: each case fails to export, to build, or to get a gradient)."""
    monkeypatch.setenv("ORTMODULE_FALLBACK_POLICY", "FALLBACK_DISABLE")
    torch.onnx.unregister_custom_op_symbolic(op, 17)  # what an earlier test registered, as before ort_zero
    model = ortmodule.ORTModule(Op(CASES[op]))
    with pytest.raises(Exception):  # noqa: B017, PT011 - ORT raises several kinds; that it fails is the point
        model(torch.randn(4, 8)).backward()
