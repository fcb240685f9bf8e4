"""MoE layers whose routing transformers computes in Python (DBRX, JetMoE, LongCat-Flash): rewritten while
ort_zero exports them, they give transformers' values and gradients in PyTorch, and train in ORT with PyTorch's losses
and gradients on batches routed differently from the traced one (without the rewrite ORT fails or differs)."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable

import pytest
import torch

import ort_zero  # noqa: F401  (before ORT: makes ORTModule importable on today's torch)
from ort_zero.examples.hf_models import model_config
from ort_zero.ort.export import rewrites as export_rewrites
from ort_zero.ort.export.rewrites import moe
from ort_zero.ort.inspection import ort_run_record
from ort_zero.patching import applied

dbrx = pytest.importorskip("transformers.models.dbrx.modeling_dbrx")
jetmoe = pytest.importorskip("transformers.models.jetmoe.modeling_jetmoe")
longcat = pytest.importorskip("transformers.models.longcat_flash.modeling_longcat_flash")

HIDDEN = 16


def tiny_config(model_type: str) -> object:
    sizes = argparse.Namespace(model_type=model_type, hidden_size=HIDDEN, layers=1, heads=2, seq_len=8)
    return model_config(sizes)


class Loss(torch.nn.Module):
    """A MoE layer's (or JetMoE's attention experts') output squared and summed, on a (batch, tokens, hidden) input."""

    def __init__(self, model_type: str) -> None:
        super().__init__()
        config = tiny_config(model_type)
        self.model_type = model_type
        if model_type == "dbrx":
            self.layer = dbrx.DbrxFFN(config)
        elif model_type == "jetmoe":
            self.layer, self.attention = jetmoe.JetMoeMoE(config), jetmoe.JetMoeMoA(config)
        else:
            self.layer = longcat.LongcatFlashMoE(config)
        for parameter in self.parameters():  # transformers leaves them empty; large enough to route apart
            torch.nn.init.normal_(parameter, std=0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layer(x)
        if self.model_type == "jetmoe":
            mapped, _, topology = self.attention.map(x)
            out = out + self.attention.reduce(mapped, topology)
        return out.square().sum()


def _step(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad()
    loss = model(x)
    loss.backward()
    return loss.detach(), [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in model.parameters()]


def assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal to float32 rounding of sums taken in another order: within 1e-5 of the tensor's largest magnitude."""
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * max(1.0, want.abs().max().item()))


TYPES = {"dbrx": export_rewrites.DBRX, "jetmoe": export_rewrites.JETMOE, "longcat_flash": export_rewrites.LONGCAT_FLASH}
BATCHES = ((2, 5), (2, 7), (1, 9))  # tokens per batch: each batch routes its tokens differently


@pytest.mark.parametrize("model_type", sorted(TYPES))
def test_the_rewrite_gives_transformers_values_and_gradients(model_type: str) -> None:
    torch.manual_seed(0)
    model = Loss(model_type)
    for shape in BATCHES:
        x = torch.randn(*shape, HIDDEN)
        expected, expected_grads = _step(model, x)
        with applied(TYPES[model_type].group):
            loss, grads = _step(model, x)
        assert_close(loss, expected)
        for grad, want in zip(grads, expected_grads, strict=True):
            assert_close(grad, want)


def _train_in_ort(model_type: str, rewritten: bool) -> Callable[[], None]:
    ortmodule = importlib.import_module("onnxruntime.training.ortmodule")
    torch.manual_seed(0)
    reference = Loss(model_type)
    model = Loss(model_type)
    model.load_state_dict(reference.state_dict())
    in_ort = ortmodule.ORTModule(model)

    def train() -> None:
        for shape in BATCHES:
            x = torch.randn(*shape, HIDDEN)
            expected, expected_grads = _step(reference, x)
            if rewritten:  # what ort_zero applies while it exports a ZeRO-3 model built from these modeling files
                with applied(TYPES[model_type].group):
                    loss, grads = _step(in_ort, x)
            else:
                loss, grads = _step(in_ort, x)
            assert ort_run_record(in_ort)["training"]["session"], "no ORT session: the model did not run in ORT"
            assert_close(loss, expected)
            for grad, want in zip(grads, expected_grads, strict=True):
                assert_close(grad, want)

    return train


@pytest.mark.parametrize("model_type", sorted(TYPES))
def test_the_rewritten_moe_trains_in_ort_as_in_pytorch(enabled: None, model_type: str) -> None:
    _train_in_ort(model_type, rewritten=True)()


@pytest.mark.parametrize("model_type", sorted(TYPES))
def test_without_the_rewrite_ort_fails_or_differs(enabled: None, model_type: str) -> None:
    train = _train_in_ort(model_type, rewritten=False)
    with pytest.raises((RuntimeError, AssertionError)):  # ORT's Split/Reshape, its shape inference, other values
        train()


def test_index_add_by_one_hot_sums_repeated_indices_as_torch() -> None:
    torch.manual_seed(0)
    index = torch.tensor([2, 0, 2, 2, 1])
    for dim, shape in ((0, (5, 3)), (1, (4, 5, 2))):
        source = torch.randn(*shape, requires_grad=True)
        base_shape = list(shape)
        base_shape[dim] = 3
        base = torch.randn(*base_shape, requires_grad=True)
        summed = moe.index_add_by_one_hot(torch.Tensor.index_add)
        for alpha in (1, 0.5):
            expected = base.index_add(dim, index, source, alpha=alpha)
            got = summed(base, dim, index, source, alpha=alpha)
            torch.testing.assert_close(got, expected)
            weights = torch.randn_like(expected)
            want = torch.autograd.grad((expected * weights).sum(), (base, source))
            for grad, wanted in zip(torch.autograd.grad((got * weights).sum(), (base, source)), want, strict=True):
                torch.testing.assert_close(grad, wanted)


def test_each_moe_rewrite_applies_to_its_model_only() -> None:
    for model_type, rewrite in TYPES.items():
        assert export_rewrites.groups_for(Loss(model_type)) == [rewrite.group]
