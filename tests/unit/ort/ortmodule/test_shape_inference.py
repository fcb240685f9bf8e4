"""ORT's symbolic shape inference finishes where it gave up on the Mamba-2 mixers: an infinite constant is no shape
value, and the recursion limit is raised while ORTModule runs it (and restored after)."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import ort_zero  # noqa: F401  (before ORT: makes ORTModule importable on today's torch)
from ort_zero import patches
from ort_zero.ort.ortmodule import shape_inference


def clamped_to_infinity() -> onnx.ModelProto:
    """x clipped to [0, inf] with both limits cast to x's type, as torch exports `clamp(x, 0.0, float("inf"))`."""
    nodes = [
        helper.make_node("Constant", [], ["low"], value=helper.make_tensor("low", TensorProto.DOUBLE, [], [0.0])),
        helper.make_node("Constant", [], ["high"], value=helper.make_tensor("high", TensorProto.DOUBLE, [], [np.inf])),
        helper.make_node("Cast", ["low"], ["low_f"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["high"], ["high_f"], to=TensorProto.FLOAT),
        helper.make_node("Clip", ["x", "low_f", "high_f"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "clamp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def infer(model: onnx.ModelProto) -> onnx.ModelProto:
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    return SymbolicShapeInference.infer_shapes(model, auto_merge=True, guess_output_rank=True)


@pytest.fixture
def without_ort_patches() -> Iterator[None]:
    """ORT's own shape inference, whatever an earlier test left applied."""
    applied = patches.is_applied("ort.shape_inference_finite_values")
    if applied:
        patches.revert_group("ort")
    yield
    if applied:
        patches.apply_group("ort")


def test_without_the_patch_an_infinite_limit_stops_shape_inference(without_ort_patches: None) -> None:
    with pytest.raises(OverflowError):
        infer(clamped_to_infinity())


def test_an_infinite_limit_is_no_shape_value() -> None:
    with patches.applied("ort"):
        inferred = infer(clamped_to_infinity())
    (output,) = inferred.graph.output
    assert [d.dim_param or d.dim_value for d in output.type.tensor_type.shape.dim] == ["batch", 4]


def test_the_recursion_limit_is_raised_while_shapes_are_inferred_only() -> None:
    seen = []
    before = sys.getrecursionlimit()
    shape_inference.with_deeper_recursion(lambda model: seen.append(sys.getrecursionlimit()))(None)
    assert seen == [max(before, shape_inference.SHAPE_INFERENCE_RECURSION_LIMIT)]
    assert sys.getrecursionlimit() == before
