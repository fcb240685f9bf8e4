"""The export override of 1-D convolutions with groups > 1 (`export_overrides`, "aten::_convolution"): ORT 1.19.2's
CPU ConvGrad clears a whole image's worth of the input gradient from each group's start, past the gradient's end,
and overwrites what ORT placed after it. A Mamba mixer (depthwise causal convolution) then gets wrong gradients in
ORT; exported as a 2-D convolution over a height of 1, it trains with PyTorch's."""

from __future__ import annotations

import importlib
from collections.abc import Callable

import pytest
import torch

import ort_zero  # noqa: F401, I001  (before ORT: makes ORTModule importable on today's torch)
from ort_zero.ort import export_overrides
from ort_zero.ort.inspection import ort_run_record

ortmodule = importlib.import_module("onnxruntime.training.ortmodule")


class GroupedConv(torch.nn.Module):
    """A grouped Conv1d (stride, dilation, padding) between two Linear layers."""

    def __init__(self, groups: int, bias: bool) -> None:
        super().__init__()
        self.inner, self.outer = torch.nn.Linear(8, 32), torch.nn.Linear(8, 8)
        self.conv = torch.nn.Conv1d(8, 4, 3, stride=2, padding=2, dilation=2, groups=groups, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.outer(self.conv(self.inner(x).view(4, 8, 4)).flatten(1)).square().mean()


@pytest.mark.parametrize(("groups", "bias"), [(4, True), (2, False), (1, True)])
def test_grouped_conv1d_trains_as_pytorch(trains_as_pytorch: Callable[..., None], groups: int, bias: bool) -> None:
    trains_as_pytorch(lambda: GroupedConv(groups, bias))


class Mixer(torch.nn.Module):
    """transformers' Mamba mixer (the sweep's tiny mamba sizes) on a fixed batch, a weighted sum of its output."""

    def __init__(self) -> None:
        from transformers import MambaConfig
        from transformers.models.mamba.modeling_mamba import MambaMixer

        super().__init__()
        config = MambaConfig(hidden_size=32, state_size=16, expand=4, conv_kernel=4, time_step_rank=48)
        self.mixer = MambaMixer(config, layer_idx=0)

    def forward(self, x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return (self.mixer(x) * weights).sum()


def _mixer_gradients_off() -> dict[str, float]:
    """Each parameter's largest gradient difference between PyTorch and an ORTModule, relative to its largest
    gradient, after one step on the same batch."""
    torch.manual_seed(0)
    reference, model = Mixer(), Mixer()
    model.load_state_dict(reference.state_dict())
    x, weights = torch.randn(2, 32, 32), torch.randn(2, 32, 32)
    reference(x, weights).backward()
    in_ort = ortmodule.ORTModule(model)
    in_ort(x, weights).backward()
    assert ort_run_record(in_ort)["training"]["session"], "no ORT session: the model did not run in ORT"
    return {
        name: float((theirs.grad - ours.grad).abs().max() / ours.grad.abs().max())
        for (name, ours), theirs in zip(reference.named_parameters(), model.parameters(), strict=True)
    }


def test_mamba_mixer_trains_in_ort_with_pytorch_gradients(enabled: None) -> None:
    off = _mixer_gradients_off()
    assert max(off.values()) < 1e-4, off


def test_without_the_override_the_mamba_mixer_gradients_are_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    """ORT's own export of the convolution (every other override in place: the mixer's softplus needs one)."""
    others = tuple(override for override in export_overrides.OVERRIDES if override.op != "aten::_convolution")
    monkeypatch.setattr(export_overrides, "OVERRIDES", others)
    monkeypatch.setenv("ORTMODULE_FALLBACK_POLICY", "FALLBACK_DISABLE")
    ort_zero.enable_zero3()
    try:
        off = _mixer_gradients_off()
    finally:
        ort_zero.disable_zero3()
    assert max(off.values()) > 1e-2, off
