"""The sixteen_bit_splits pass: a bf16 Split (lengths a constant) and a bf16 SplitTraining (lengths its
ConcatTraining's, known when it runs), which ORT's CPU provider refuses when it runs, run after the pass as Slices in
bf16, with the values a split gives; a split into one output is the Identity; ORT's session optimizer does not fuse
the Slices back into a Split; a float32 graph and a Split without lengths are left alone."""

from __future__ import annotations

import onnx
import onnxruntime
import pytest
import torch
from onnx import TensorProto, helper

import ort_zero  # noqa: F401  (before ORT: makes ORTModule importable on today's torch)
from ort_zero.ort.passes import sixteen_bit_splits
from ort_zero.ort.passes.base import TrainingGraph

BF16, FLOAT = TensorProto.BFLOAT16, TensorProto.FLOAT
OPSETS = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]


def _splits(dtype: int = BF16, lengths: bool = True) -> onnx.ModelProto:
    """x [2, 3, 8] in `dtype`: a Split of its last axis into 3 + 5 (constant lengths), and the split of the
    ConcatTraining of x and x along axis 1 back into its two parts (the lengths ConcatTraining writes), and into one."""
    nodes = [
        helper.make_node("Cast", ["x32"], ["x"], name="cast_x", to=dtype),
        helper.make_node("Split", ["x", "lengths"] if lengths else ["x"], ["a", "b"], name="split", axis=-1),
        helper.make_node(
            "ConcatTraining", ["x", "x"], ["xx", "per_input"], name="concat", axis=1, domain="com.microsoft"
        ),
        helper.make_node(
            "SplitTraining", ["xx", "per_input"], ["c", "d"], name="split_training", axis=1, domain="com.microsoft"
        ),
        helper.make_node("ConcatTraining", ["x"], ["x1", "one"], name="concat_one", axis=1, domain="com.microsoft"),
        helper.make_node("SplitTraining", ["x1", "one"], ["e"], name="split_one", axis=1, domain="com.microsoft"),
    ]
    outputs = ["a", "b", "c", "d", "e"]
    nodes += [helper.make_node("Cast", [name], [f"{name}32"], name=f"cast_{name}", to=FLOAT) for name in outputs]
    initializers = [helper.make_tensor("lengths", TensorProto.INT64, [2], [3, 5])] if lengths else []
    graph = helper.make_graph(
        nodes,
        "splits",
        [helper.make_tensor_value_info("x32", FLOAT, [2, 3, 8])],
        [helper.make_tensor_value_info(f"{name}32", FLOAT, None) for name in outputs],
        initializers,
        value_info=[helper.make_tensor_value_info(name, dtype, None) for name in ["x", "xx", "x1", *outputs]]
        + [helper.make_tensor_value_info(name, TensorProto.INT64, None) for name in ("per_input", "one")],
    )
    return helper.make_model(graph, opset_imports=OPSETS, ir_version=9)  # ORT 1.19.2 reads IR up to 10


def _run(model: onnx.ModelProto, x: torch.Tensor) -> list[torch.Tensor]:
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return [torch.from_numpy(value) for value in session.run(None, {"x32": x.numpy()})]


def _passed(model: onnx.ModelProto) -> sixteen_bit_splits.SlicedSplits:
    return sixteen_bit_splits.run(TrainingGraph(model.graph, recompute_level=0, opsets=tuple(OPSETS)))


def test_without_the_pass_the_cpu_provider_refuses_the_16_bit_split_when_it_runs() -> None:
    with pytest.raises(Exception, match="Split operator does not support"):
        _run(_splits(), torch.randn(2, 3, 8))


def test_the_splits_run_as_16_bit_slices_with_a_splits_values() -> None:
    model = _splits()
    report = _passed(model)
    assert report.sliced == 3
    ops = [node.op_type for node in model.graph.node]
    assert "Split" not in ops and "SplitTraining" not in ops and ops.count("Identity") == 1
    x = torch.randn(2, 3, 8).bfloat16().float()  # values bf16 holds: the casts change nothing
    a, b, c, d, e = _run(model, x)
    assert torch.equal(a, x[..., :3]) and torch.equal(b, x[..., 3:])
    assert torch.equal(c, x) and torch.equal(d, x) and torch.equal(e, x)


def test_a_float32_graph_and_a_split_without_lengths_are_left_alone() -> None:
    for model in (_splits(FLOAT), _splits(lengths=False)):
        before = [node.op_type for node in model.graph.node]
        _passed(model)
        assert [node.op_type for node in model.graph.node].count("Split") == before.count("Split") == 1
