"""ZeROOffloadSubscriber with the fake offload of conftest.py: returned parameters, checkpoints while exporting.

DeepSpeed's post-forward hands a parameter a module returns to the enclosing module as an external parameter and
gathers it; the tensor that leaves each module boundary says which parameter it stands for (`ds_param_alias`).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from deepspeed.runtime.activation_checkpointing.checkpointing import non_reentrant_checkpoint
from torch import nn
from torch.utils.checkpoint import checkpoint

from ort_zero import settings
from ort_zero.hooks import exporting
from ort_zero.zero3 import activation_checkpointing
from ort_zero.zero3.subscriber import Carried


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
    def __init__(self, checkpoint: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.inner = nn.Linear(2, 2)
        self.checkpoint = checkpoint

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.checkpoint(self.inner, x)


NON_REENTRANT = {
    "torch.utils.checkpoint.checkpoint": lambda f, x: checkpoint(f, x, use_reentrant=False),
    "deepspeed.checkpointing.non_reentrant_checkpoint": lambda f, x: non_reentrant_checkpoint(f, x),
}


@pytest.mark.parametrize("kind", sorted(NON_REENTRANT))
def test_export_inside_a_non_reentrant_checkpoint_meets_the_checkpoint_policy(
    subscribe: Callable, deepspeed_init: Callable, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """A non-reentrant checkpoint never reaches CheckpointFunction: the subscriber finds it on the stack while the
    model is exported. Level 1: traced as a plain call, to be announced after the export; level 0: one line."""
    monkeypatch.setattr(activation_checkpointing, "_pending", None)
    plain = nn.Sequential(nn.Linear(2, 2))
    model = Checkpointed(NON_REENTRANT[kind])
    for root in (plain, model):
        deepspeed_init(root)
        subscribe(root)
    monkeypatch.setattr(settings, "recompute_level_override", 1)
    with exporting():
        plain(torch.randn(3, 2, requires_grad=True))
        assert activation_checkpointing._pending is None, "no checkpoint, yet the policy was applied"
        model(torch.randn(3, 2, requires_grad=True))
    assert activation_checkpointing._pending == 1
    monkeypatch.setattr(settings, "recompute_level_override", 0)
    model(torch.randn(3, 2, requires_grad=True))  # not exporting: the checkpoint runs as in PyTorch
    with (
        exporting(),
        pytest.raises(activation_checkpointing.CheckpointingRefused, match=f"the model calls {kind} while"),
    ):
        model(torch.randn(3, 2, requires_grad=True))


def test_bool_tensors_pass_around_the_bridges() -> None:
    """ORT 1.19.2 returns a PythonOp's bool outputs as uint8: a bool mask is not carried by a bridge, and the
    bridge's outputs take the places of the tensors it carried."""
    hidden, mask, ids = torch.randn(2, 3), torch.ones(2, 3, dtype=torch.bool), torch.arange(3)
    carried = Carried((hidden, mask, ids))
    assert carried.tensors == (hidden, ids)
    replaced = (hidden + 1, ids + 1)
    merged = carried.merged(replaced)
    assert merged[0] is replaced[0] and merged[1] is mask and merged[2] is replaced[1]
