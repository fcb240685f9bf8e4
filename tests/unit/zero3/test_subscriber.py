"""ZeROOffloadSubscriber on a module that returns its own parameter, with the fake offload of conftest.py.

DeepSpeed's post-forward hands such a parameter to the enclosing module as an external parameter and gathers it;
the tensor that leaves each module boundary says which parameter it stands for (`ds_param_alias`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


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
