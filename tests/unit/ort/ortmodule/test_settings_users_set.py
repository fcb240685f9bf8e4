"""ORTModule settings users may set, with ort_zero's replacements installed (`ort_zero.ort.ortmodule`)."""

from __future__ import annotations

import pytest
import torch

from ..conftest import TrainsAsPytorch


def test_a_model_trains_with_the_compute_optimizer_off(
    monkeypatch: pytest.MonkeyPatch, trains_as_pytorch: TrainsAsPytorch
) -> None:
    """ORTMODULE_ENABLE_COMPUTE_OPTIMIZER=0 turns off the sparsity checks ORT installs for the export; ORT 1.19.2
    then iterates over the None its installers return and the export fails."""
    monkeypatch.setenv("ORTMODULE_ENABLE_COMPUTE_OPTIMIZER", "0")

    record = trains_as_pytorch(_SummedMlp)
    assert record["session"]


class _SummedMlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x).sum()
