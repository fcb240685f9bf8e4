"""Autograd Functions and no_grad blocks of model code while ort_zero exports it: PhiMoE's multiplier Function with
zeros for its None gradients and its output's shape declared (ort_zero/ort/export/autograd.py), and HRM's
no_grad cycles (`export_rewrites.HRM_TEXT`): an ONNX graph has no grad mode, so ORT differentiated the low-level cycles
HRM runs under torch.no_grad(); with the rewrite a stack called inside the model's own no_grad passes no gradient
back, and ORT's gradients are PyTorch's."""

from __future__ import annotations

import importlib

import pytest
import torch

import ort_zero  # noqa: F401  (before ORT: makes ORTModule importable on today's torch)
from ort_zero.ort.export import rewrites as export_rewrites
from ort_zero.ort.export.rewrites import autograd_functions
from ort_zero.ort.inspection import ort_run_record
from ort_zero.patching import applied

phimoe = pytest.importorskip("transformers.models.phimoe.modeling_phimoe")


class PhimoeRouter(torch.nn.Module):
    """PhiMoE's sparsemixer in small: PhimoeMultiplier gets the scores, a GatherElements of their softmax and the
    softmax (its backward returns None for both), and its output scales the hidden states by broadcasting."""

    def __init__(self) -> None:
        super().__init__()
        self.router, self.out = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.router(x)
        gates = scores.softmax(-1)
        picked = gates.argmax(-1, keepdim=True)
        mask = torch.ones_like(picked, dtype=x.dtype)
        weight = phimoe.PhimoeMultiplier.apply(scores, gates.gather(-1, picked), picked, gates, mask)
        return self.out(x * weight).square().mean()


@pytest.mark.parametrize("rewritten", [True, False])
def test_phimoe_multiplier_trains_in_ort_as_in_pytorch_only_rewritten(
    rewritten: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without ort_zero's export of Functions ORT's GatherElements gradient misses its input (the Function's None);
    its zeros and PhiMoE's declared output shape give PyTorch's loss and gradients."""
    from ort_zero import patches

    monkeypatch.setenv("ORTMODULE_FALLBACK_POLICY", "FALLBACK_DISABLE")
    torch.manual_seed(0)
    reference, model = PhimoeRouter(), PhimoeRouter()
    model.load_state_dict(reference.state_dict())
    x = torch.randn(4, 8)
    expected = reference(x)
    expected.backward()
    in_ort = importlib.import_module("onnxruntime.training.ortmodule").ORTModule(model)
    if rewritten:
        with patches.applied("export_autograd_functions"):  # ORTModule exports at the first forward
            in_ort(x)
    if not rewritten:
        with pytest.raises(RuntimeError, match="GatherElements"):
            in_ort(x).backward()
        return
    loss = in_ort(x)
    loss.backward()
    assert ort_run_record(in_ort)["training"]["session"], "no ORT session"
    torch.testing.assert_close(loss, expected)
    for got, want in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-4, atol=1e-7)


hrm_text = pytest.importorskip("transformers.models.hrm_text.modeling_hrm_text")
ortmodule = importlib.import_module("onnxruntime.training.ortmodule")


class Hrm(torch.nn.Module):
    """A tiny HRM (one layer per stack, 2 high-level cycles of 3 low-level ones, gradients through the last) on
    a (2, 8) batch."""

    def __init__(self) -> None:
        from transformers import HrmTextConfig

        super().__init__()
        config = HrmTextConfig(
            vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
            head_dim=8, H_cycles=2, L_cycles=3, L_bp_cycles=[1],
        )  # fmt: skip
        config._attn_implementation = "eager"
        self.model = hrm_text.HrmTextModel(config)
        # the output is RMS-normalized (its mean square is 1): weighted, so that the loss depends on it
        self.register_buffer("weights", torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(1)))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return (self.model(input_ids=ids).last_hidden_state * self.weights).sum()


def _gradients_off(rewritten: bool) -> dict[str, float]:
    """Each parameter's largest gradient difference between PyTorch and an ORTModule (exported with the rewrite or
    without), relative to its largest gradient, after one step on the same batch."""
    torch.manual_seed(0)
    reference, model = Hrm(), Hrm()
    model.load_state_dict(reference.state_dict())
    ids = torch.randint(0, 64, (2, 8))
    reference(ids).backward()
    in_ort = ortmodule.ORTModule(model)
    if rewritten:  # what ort_zero applies while ORTModule exports a ZeRO-3 HRM
        with applied(export_rewrites.HRM_TEXT.group):
            loss = in_ort(ids)
    else:
        loss = in_ort(ids)
    loss.backward()
    assert ort_run_record(in_ort)["training"]["session"], "no ORT session: the model did not run in ORT"
    return {
        name: float((got.grad - expected.grad).abs().max() / expected.grad.abs().max())
        for (name, expected), got in zip(reference.named_parameters(), model.parameters(), strict=True)
        if expected.grad is not None and expected.grad.abs().max() > 0
    }


def test_hrm_trains_in_ort_with_pytorch_gradients(enabled: None) -> None:
    off = _gradients_off(rewritten=True)
    assert max(off.values()) < 1e-4, off


def test_without_the_rewrite_ort_differentiates_the_no_grad_cycles(enabled: None) -> None:
    off = _gradients_off(rewritten=False)
    assert max(off.values()) > 1e-2, off


def test_the_counted_no_grad_is_torch_no_grad_and_counts_the_models_blocks_only() -> None:
    counted = autograd_functions.counting_no_grad(torch.no_grad)
    with torch.enable_grad(), counted():  # entered here, not by transformers' code
        assert not torch.is_grad_enabled()
        assert autograd_functions._ModelNoGrad.depth == 0
    model_code = {"__name__": hrm_text.__name__, "counted": counted, "depth": autograd_functions._ModelNoGrad}
    exec("with counted():\n    inside = depth.depth", model_code)  # noqa: S102 - a block in a transformers module
    assert model_code["inside"] == 1
    assert autograd_functions._ModelNoGrad.depth == 0
    x = torch.randn(3, requires_grad=True)
    (autograd_functions.ZeroGradient.apply(x * 2) * x).sum().backward()
    torch.testing.assert_close(x.grad, 2 * x.detach())  # only the direct use of x: the detached one adds nothing
