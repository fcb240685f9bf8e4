"""Users' checkpoints while a ZeRO-3 model is exported, with the export-time patches applied as ORTModule applies
them: at recompute level 1 or 2 a checkpoint runs its function directly, however it was bound, and is announced once
the export is over, once per process; at level 0 it stops the run with one line. (The subscriber's part:
test_subscriber.py; a real ORTModule export: tests/unit/ort/test_activation_checkpointing_in_export.py; 2 ranks:
tests/distributed/test_zero3_checkpointing.py.)
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import deepspeed
import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint  # bound by name before anything is patched, as model code does

from ort_zero import patches, settings
from ort_zero.zero3 import activation_checkpointing

CALLS: dict[str, Callable[[Callable[..., Any], torch.Tensor], Any]] = {
    "torch, bound by name": lambda f, x: checkpoint(f, x, use_reentrant=True),
    "torch, Hugging Face's partial": lambda f, x: functools.partial(checkpoint, use_reentrant=True)(f, x),
    "torch, module attribute": lambda f, x: torch.utils.checkpoint.checkpoint(f, x, use_reentrant=True),
    "deepspeed": lambda f, x: deepspeed.checkpointing.checkpoint(f, x),
}


@pytest.fixture
def level(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], None]:
    """`level(n)` sets the recompute level; the process has announced nothing yet."""
    monkeypatch.setattr(activation_checkpointing, "_announced", False)
    monkeypatch.setattr(activation_checkpointing, "_pending", None)
    return lambda value: monkeypatch.setattr(settings, "recompute_level_override", value)


class Counted(nn.Linear):
    def __init__(self) -> None:
        super().__init__(4, 4)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return super().forward(x)


def checkpoint_nodes(tensor: torch.Tensor) -> list[str]:
    """Names of the checkpoint autograd nodes in the graph behind `tensor`."""
    found, seen, todo = [], set(), [tensor.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if "Checkpoint" in type(node).__name__:
            found.append(type(node).__name__)
        todo.extend(next_node for next_node, _ in node.next_functions)
    return found


@pytest.mark.parametrize("recompute_level", [1, 2])
@pytest.mark.parametrize("call", sorted(CALLS))
def test_at_level_1_or_2_a_checkpoint_runs_its_function_directly(level: Callable, call: str, recompute_level: int):
    level(recompute_level)
    layer, x = Counted(), torch.randn(3, 4, requires_grad=True)
    assert checkpoint_nodes(CALLS[call](layer, x)), "not a checkpoint outside an export: the test proves nothing"
    layer.calls = 0
    with patches.applied("ort_export"):
        y = CALLS[call](layer, x)
    assert layer.calls == 1 and not checkpoint_nodes(y), "the export would see a checkpoint"
    y.sum().backward()
    torch.testing.assert_close(x.grad, layer.weight.sum(dim=0).expand(3, 4))
    assert activation_checkpointing._pending == recompute_level, "nothing left to announce after the export"
    assert checkpoint_nodes(CALLS[call](layer, x)), "the export-time patches outlived the export"


@pytest.mark.parametrize("call", sorted(CALLS))
def test_at_level_0_a_checkpoint_stops_the_run_with_one_line(level: Callable, call: str) -> None:
    level(0)
    layer = Counted()
    with patches.applied("ort_export"), pytest.raises(activation_checkpointing.CheckpointingRefused) as refused:
        CALLS[call](layer, torch.randn(3, 4, requires_grad=True))
    message = refused.value.code  # what an uncaught SystemExit prints, exit status 1
    assert isinstance(message, str) and message.endswith("\n") and "\n" not in message[:-1] and layer.calls == 0
    what = "deepspeed.checkpointing.checkpoint" if call == "deepspeed" else "checkpoint(use_reentrant=True)"
    assert message.startswith("ort_zero: the model calls ") and what in message, message
    assert "ORTMODULE_MEMORY_OPT_LEVEL=1" in message and "without ORTModule" in message


def test_deepspeed_checkpoint_returns_every_output_of_the_function(level: Callable) -> None:
    """DeepSpeed's checkpoint hands back what the function returned, non-tensor outputs included."""
    level(1)

    def several(x: torch.Tensor) -> tuple[torch.Tensor, int, torch.Tensor]:
        return x * 2, 7, x + 1

    x = torch.ones(2, requires_grad=True)
    natively = deepspeed.checkpointing.checkpoint(several, x)
    with patches.applied("ort_export"):
        exported = deepspeed.checkpointing.checkpoint(several, x)
    assert [type(o) for o in exported] == [type(o) for o in natively] == [torch.Tensor, int, torch.Tensor]
    for got, expected in zip(exported, natively, strict=True):
        assert got == expected if isinstance(got, int) else torch.equal(got, expected)


def test_announced_once_the_export_is_over_and_once_per_process(
    level: Callable, caplog: pytest.LogCaptureFixture
) -> None:
    """ORT captures what is printed while it exports (and shows it on rank 0 only): the announcement waits."""
    level(1)
    layer, x = Counted(), torch.randn(3, 4, requires_grad=True)
    said_during_export = []

    def export() -> str:
        with patches.applied("ort_export"):
            checkpoint(layer, x, use_reentrant=True)
        said_during_export.append(len(caplog.records))
        return "exported"

    export_model = activation_checkpointing.announcing_after(staticmethod(export)).__func__
    with caplog.at_level(logging.WARNING, logger=activation_checkpointing.__name__):
        assert export_model() == "exported" and export_model() == "exported"
    assert said_during_export == [0, 1]
    (announcement,) = [r.getMessage() for r in caplog.records]
    assert "\n" not in announcement and "layer-wise recompute (ORTMODULE_MEMORY_OPT_LEVEL=1)" in announcement
