"""The same_type_casts pass: a Cast to its input's own type whose output one node reads twice (`x * x` after
`.to(torch.float32)`, as the L2 norm in Qwen3.5's linear attention) is removed, and the model trains in ORT as in
PyTorch; without the pass ORT's cast propagation fails to build the graph (Graph::RemoveEdge)."""

from __future__ import annotations

from collections.abc import Callable

import onnx
import pytest
import torch
from onnx import helper

import ort_zero  # noqa: E402, F401, I001  (before ORT: makes ORTModule importable on today's torch)
from ort_zero.ort.passes import pipeline, same_type_casts
from ort_zero.ort.passes.base import ExportedGraph

FLOAT, INT64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64


class SquaredAfterCast(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner, self.outer = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inner(x).transpose(0, 1).contiguous().to(torch.float32)  # a Cast float -> float in the export
        return self.outer((h * h).transpose(0, 1)).square().mean()


def test_trains_in_ort_as_pytorch(trains_as_pytorch: Callable[..., None]) -> None:
    trains_as_pytorch(SquaredAfterCast)


def test_without_the_pass_ort_cannot_build_the_graph(
    trains_as_pytorch: Callable[..., None], monkeypatch: pytest.MonkeyPatch
) -> None:
    others = tuple(p for p in pipeline.EXPORT_PASSES if p is not same_type_casts.PASS)
    monkeypatch.setattr(pipeline, "EXPORT_PASSES", others)
    with pytest.raises(Exception, match="RemoveEdge"):
        trains_as_pytorch(SquaredAfterCast)


def _graph(cast_to: int, second_input: str, typed: bool = True) -> onnx.ModelProto:
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Cast", ["r"], ["c"], name="cast", to=cast_to),
        helper.make_node("Mul", ["c", second_input], ["y"], name="mul"),
    ]
    value_info = [helper.make_tensor_value_info("r", FLOAT, [4])] if typed else []
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", FLOAT, [4]), helper.make_tensor_value_info("z", cast_to, [4])],
        [helper.make_tensor_value_info("y", cast_to, [4])],
        value_info=value_info,
    )
    return helper.make_model(graph)


@pytest.mark.parametrize("typed", [True, False], ids=["value_info", "onnx_inference"])
def test_removes_a_same_type_cast_read_twice_by_one_node(typed: bool) -> None:
    model = _graph(FLOAT, "c", typed)
    report = same_type_casts.run(ExportedGraph(model, torch.nn.Module(), training=True, mem_efficient_grads=False))
    assert report.removed == ["cast"]
    assert [node.op_type for node in model.graph.node] == ["Relu", "Mul"]
    assert list(model.graph.node[1].input) == ["r", "r"]


@pytest.mark.parametrize(("cast_to", "second_input"), [(INT64, "c"), (FLOAT, "z")], ids=["other_type", "read_once"])
def test_leaves_other_casts_to_ort(cast_to: int, second_input: str) -> None:
    model = _graph(cast_to, second_input)
    report = same_type_casts.run(ExportedGraph(model, torch.nn.Module(), training=True, mem_efficient_grads=False))
    assert report.removed == []
    assert len(model.graph.node) == 3
