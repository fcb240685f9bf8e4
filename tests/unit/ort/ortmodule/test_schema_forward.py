"""ORTModule's output-schema forward under ZeRO-3: on fake tensors (no compute), on real ones where the model needs
real values, and the same outputs' structure either way."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

from ort_zero.ort.ortmodule import graph_transition_manager
from ort_zero.ort.ortmodule.graph_transition_manager import schema_forward


@pytest.fixture(autouse=True)
def no_export_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    """The schema forward alone: none of the export-time patch groups around it."""
    monkeypatch.setattr(graph_transition_manager, "during_export", lambda module: contextlib.nullcontext())


class Recording(nn.Module):
    """A ZeRO-3 module (its parameter has a ds_id) that notes what kind of tensor each forward computed on."""

    def __init__(self, data_dependent: bool) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)
        self.linear.weight.ds_id = 0
        self.data_dependent = data_dependent
        self.seen: list[bool] = []

    def forward(self, x: torch.Tensor) -> dict[str, Any]:
        hidden = self.linear(x)
        self.seen.append(isinstance(hidden, FakeTensor))
        if self.data_dependent and bool(hidden.sum() > 1e9):  # a branch on a value
            hidden = hidden * 2
        return {"logits": hidden, "pooled": hidden.mean(0)}


def read_schema(module: nn.Module, x: torch.Tensor) -> list[tuple[str, int]]:
    """What ORT's schema forward reads of the outputs: names and the number of dimensions of each."""
    with torch.no_grad():
        outputs = module(x)
    return [(name, value.dim()) for name, value in outputs.items()]


def test_the_schema_forward_computes_nothing() -> None:
    module = Recording(data_dependent=False)
    x = torch.randn(5, 4)

    schema = schema_forward(read_schema)(module, x)

    assert module.seen == [True]
    assert schema == read_schema(Recording(data_dependent=False), x)


def test_a_model_that_needs_values_gets_a_real_forward() -> None:
    module = Recording(data_dependent=True)

    schema = schema_forward(read_schema)(module, torch.randn(5, 4))

    assert module.seen == [True, False]
    assert schema == [("logits", 2), ("pooled", 1)]


def test_a_model_without_zero3_parameters_is_left_to_ort() -> None:
    module = Recording(data_dependent=False)
    del module.linear.weight.ds_id

    schema_forward(read_schema)(module, torch.randn(5, 4))

    assert module.seen == [False]


class ConvertingItsBuffer(Recording):
    """Stores its buffer converted to the input's dtype in its forward, as CTRL does with its positional encoding."""

    def __init__(self) -> None:
        super().__init__(data_dependent=False)
        self.register_buffer("table", torch.arange(4.0), persistent=False)

    def forward(self, x: torch.Tensor) -> dict[str, Any]:
        self.table = self.table.to(x.dtype)
        return super().forward(x + self.table)


def test_a_buffer_the_model_replaces_on_fake_tensors_stays_real() -> None:
    module = ConvertingItsBuffer().to(torch.bfloat16)
    module.table = module.table.float()
    table = module.table

    schema_forward(read_schema)(module, torch.randn(5, 4, dtype=torch.bfloat16))

    assert module.seen == [True] and module.table is table and not isinstance(module.table, FakeTensor)
