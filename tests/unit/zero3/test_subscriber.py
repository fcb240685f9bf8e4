"""ZeROOffloadSubscriber with the fake offload of conftest.py: returned parameters, checkpoints while exporting.

DeepSpeed's post-forward hands a parameter a module returns to the enclosing module as an external parameter and
gathers it; the tensor that leaves each module boundary says which parameter it stands for (`ds_param_alias`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from ort_zero.hooks import exporting


class ReturnsBias(nn.Linear):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return super().forward(x), self.bias


class Middle(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = ReturnsBias(2, 2)
        self.received: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out, bias = self.inner(x)
        self.received.append(bias)
        return out, bias


class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.middle = Middle()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, bias = self.middle(x)
        return (out + bias).sum()


def test_returned_parameter_moves_to_the_module_that_uses_it(subscribe: Callable, deepspeed_init: Callable) -> None:
    model = Outer()
    deepspeed_init(model)
    bias = model.middle.inner.bias
    gathers: list[torch.nn.Parameter] = []
    for param in model.parameters():
        param.is_external_param = False
        param.all_gather = lambda param=param: gathers.append(param)
    subscribe(model)
    x = torch.randn(3, 2, requires_grad=True)

    model(x).backward()
    (received,) = model.middle.received
    assert received is not bias and received.ds_param_alias is bias, "the boundary hid which parameter it was"
    assert bias.is_external_param and gathers == [bias, bias]  # registered with middle, then moved to outer
    assert list(model._external_params.values()) == [bias]
    assert not model.middle._external_params and not model.middle.inner._external_params
    torch.testing.assert_close(bias.grad, torch.full((2,), 2.0 * 3))  # through the linear and the returned bias

    model(x)
    assert gathers == [bias, bias], "a parameter the running outer module owns is not handed over again"
    assert list(model._external_params.values()) == [bias]


class Checkpointed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.inner, x, use_reentrant=False)


@pytest.mark.parametrize("use_checkpoint", [True, False])
def test_export_inside_a_checkpoint_warns_that_ort_will_not_recompute(
    subscribe: Callable, deepspeed_init: Callable, caplog: pytest.LogCaptureFixture, use_checkpoint: bool
) -> None:
    """ONNX Runtime runs a checkpointed region once and keeps its activations: said while exporting, once."""
    model = Checkpointed() if use_checkpoint else nn.Sequential(nn.Linear(2, 2))
    deepspeed_init(model)
    subscribe(model)
    with exporting(), caplog.at_level(logging.WARNING, logger="ort_zero.zero3.subscriber"):
        model(torch.randn(3, 2, requires_grad=True))
        model(torch.randn(3, 2, requires_grad=True))
    warnings = [r.getMessage() for r in caplog.records if "torch.utils.checkpoint" in r.getMessage()]
    assert len(warnings) == (1 if use_checkpoint else 0)
    assert all(w.startswith("ort_zero: Linear runs inside torch.utils.checkpoint") for w in warnings)
