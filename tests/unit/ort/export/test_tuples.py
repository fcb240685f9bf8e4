"""A pass-through Function (as every bridge is) whose tuple of outputs nothing reads: torch's tuple lowering stops
the export without ort_zero's unpack, and with it the model trains in ORT as in PyTorch."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from ort_zero import patches
from ort_zero.ort.export import tuples as export_tuples

from ..conftest import TrainsAsPytorch


class Noted(torch.autograd.Function):
    """Returns its two inputs unchanged as a tuple (a bridge acts by side effect; nothing reads its outputs)."""

    @staticmethod
    def forward(ctx: Any, first: torch.Tensor, second: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return first.detach(), second.detach()

    @staticmethod
    def backward(ctx: Any, first: torch.Tensor | None, second: torch.Tensor | None) -> tuple[Any, Any]:
        return first, second


class UnreadPair(torch.nn.Module):
    """A model whose cos/sin-like pair goes through `Noted` and is then never read (an unused rotary embedding)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        Noted.apply(x.cos(), x.sin())
        return self.linear(x).pow(2).mean()


def test_an_unread_tuple_of_a_python_op_gets_an_unpack() -> None:
    graph, _ = torch.jit._get_trace_graph(UnreadPair(), (torch.randn(4, 8),))
    (python_op,) = [node for node in graph.nodes() if node.kind() == "prim::PythonOp"]
    assert not python_op.output().uses(), "the tracer kept the unpack: the test proves nothing"
    assert export_tuples.unpack_unread_tuples(graph) == 1
    assert [use.user.kind() for use in python_op.output().uses()] == ["prim::TupleUnpack"]
    assert export_tuples.unpack_unread_tuples(graph) == 0


def test_a_model_with_an_unread_tuple_trains_as_in_pytorch(
    trains_as_pytorch: TrainsAsPytorch,
) -> None:
    """Exported with the export-time patches as ORTModule exports a ZeRO-3 model (the model itself needs none)."""
    with patches.applied("ort_export"):
        record = trains_as_pytorch(UnreadPair)
    # What ORT does with it: a PythonOp nothing reads is not in the graph it runs (for a ZeRO-3 bridge: its release
    # does not run in ORT, the module's parameters stay gathered until its backward releases them)
    assert record["python_ops"] == []


def test_without_the_unpack_the_export_cannot_lower_the_tuple(enabled: None) -> None:
    """What torch alone does with the same model (the fix is needed)."""
    import onnxruntime.training.ortmodule as ortmodule

    with pytest.raises(Exception, match="lower all tuples"):
        ortmodule.ORTModule(UnreadPair())(torch.randn(4, 8))
