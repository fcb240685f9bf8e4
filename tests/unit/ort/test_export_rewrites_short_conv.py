"""The LFM short convolution (lfm2, lfm2_moe, lfm3): exported as transformers writes it (a Conv padded on both sides,
then a Slice), ORT 1.19.2 gives its out_proj weight another gradient than PyTorch wherever the input's gradient is
computed too; with the left-padded causal convolution ort_zero rewrites it to while exporting, ORT trains it with
PyTorch's loss and gradients."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable

import pytest
import torch

import ort_zero  # noqa: F401  (before ORT: makes ORTModule importable on today's torch)
from ort_zero.examples.hf_models import model_config
from ort_zero.ort import export_rewrites
from ort_zero.ort.inspection import ort_run_record
from ort_zero.patching import applied

HIDDEN = 32
REWRITES = {rewrite.model_types[0]: rewrite for rewrite in export_rewrites.SHORT_CONVS}
SHORT_CONV_CLASSES = {"lfm2": "Lfm2ShortConv", "lfm2_moe": "Lfm2MoeShortConv", "lfm3": "Lfm3ShortConv"}


class Loss(torch.nn.Module):
    """A short-convolution block of `model_type` (its modeling file's class), its output weighted and summed."""

    def __init__(self, model_type: str) -> None:
        super().__init__()
        config = model_config(
            argparse.Namespace(model_type=model_type, hidden_size=HIDDEN, layers=1, heads=4, seq_len=32)
        )
        config.layer_types = ["conv"]
        modeling = importlib.import_module(REWRITES[model_type].modeling_module)
        self.conv = getattr(modeling, SHORT_CONV_CLASSES[model_type])(config, layer_idx=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.conv(x) * torch.arange(HIDDEN, dtype=x.dtype)).sum()


def _step(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Loss and gradients of the parameters and of the input (which the graph then computes as well)."""
    model.zero_grad()
    x = x.detach().requires_grad_()
    loss = model(x)
    loss.backward()
    return loss.detach(), [*(p.grad.clone() for p in model.parameters()), x.grad]


def _train_in_ort(model_type: str, rewritten: bool) -> Callable[[], None]:
    ortmodule = importlib.import_module("onnxruntime.training.ortmodule")
    torch.manual_seed(0)
    reference, model = Loss(model_type), Loss(model_type)
    model.load_state_dict(reference.state_dict())
    in_ort = ortmodule.ORTModule(model)

    def train() -> None:
        x = torch.randn(2, 32, HIDDEN)
        expected, expected_grads = _step(reference, x)
        if rewritten:  # what ort_zero applies while it exports a ZeRO-3 model built from these modeling files
            with applied(REWRITES[model_type].group):
                loss, grads = _step(in_ort, x)
        else:
            loss, grads = _step(in_ort, x)
        assert ort_run_record(in_ort)["training"]["session"], "no ORT session: the model did not run in ORT"
        torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5 * expected.abs().item())
        for grad, want in zip(grads, expected_grads, strict=True):
            torch.testing.assert_close(grad, want, rtol=1e-4, atol=1e-5 * want.abs().max().item())

    return train


@pytest.mark.parametrize("model_type", sorted(REWRITES))
def test_the_rewritten_short_conv_trains_in_ort_as_in_pytorch(enabled: None, model_type: str) -> None:
    _train_in_ort(model_type, rewritten=True)()


@pytest.mark.parametrize("model_type", sorted(REWRITES))
def test_without_the_rewrite_ort_gives_other_gradients(enabled: None, model_type: str) -> None:
    train = _train_in_ort(model_type, rewritten=False)
    with pytest.raises(AssertionError, match="Tensor-likes are not close"):
        train()


def test_each_short_conv_rewrite_applies_to_its_model_only() -> None:
    for model_type, rewrite in REWRITES.items():
        assert export_rewrites.groups_for(Loss(model_type)) == [rewrite.group]
