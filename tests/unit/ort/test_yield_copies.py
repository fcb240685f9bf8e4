"""The PythonOps feeding ORT's YieldOp return copies (`ort_zero.ort.yield_copies`): ORT plans no alias there.

Without it, ORT with memory reuse overwrote a buffer the model's output still lived in (measured on 2 ranks: the
final LayerNorm's bias gradient was wrong; `tests/distributed/test_recompute.py` compares gradients with reuse on
and off).
"""

from __future__ import annotations

import onnx
import pytest
import torch
from onnx import helper

pytest.importorskip("onnxruntime.training.ortmodule")

from ort_zero.hooks import passthrough  # noqa: E402
from ort_zero.hooks.statistics import EndStep  # noqa: E402
from ort_zero.ort.graph import MS_DOMAIN, ints_attribute, qualified_name  # noqa: E402
from ort_zero.ort.yield_copies import copy_forward_outputs  # noqa: E402
from ort_zero.zero3.bridges import PostForwardBridge  # noqa: E402

REUSE = "tensor_reuse_map"


def pass_through(func: str, name: str, inputs: list[str], key: int) -> onnx.NodeProto:
    outputs = [f"{name}_ctx", *(f"{name}_{i}" for i in range(len(inputs)))]
    return helper.make_node("PythonOp", inputs, outputs, name, domain=MS_DOMAIN, func_name=func,
                            input_int_scalars=[key], tensor_reuse_map=[-1, *range(len(inputs))])  # fmt: skip


def test_the_bridge_before_the_yield_returns_copies_and_others_keep_their_views() -> None:
    post = qualified_name(PostForwardBridge)
    inner = pass_through(post, "inner", ["h"], key=101)
    outer = pass_through(post, "outer", ["inner_0", "loss"], key=102)
    foreign = pass_through("user_code.Fn", "foreign", ["z"], key=103)
    nodes = [
        inner,
        outer,
        foreign,
        helper.make_node("Identity", ["outer_0"], ["output-0"], "out0"),
        helper.make_node("Identity", ["outer_1"], ["output-1"], "out1"),
        helper.make_node(
            "YieldOp", ["output-0", "output-1", "foreign_0"], ["g0", "g1", "g2"], "yield", domain=MS_DOMAIN
        ),  # fmt: skip
    ]
    graph = helper.make_graph(nodes, "g", [], [])

    assert copy_forward_outputs(graph) == ["outer"]
    inner, outer, foreign = graph.node[:3]  # make_graph copied the nodes

    assert ints_attribute(outer, REUSE) == [-1, -1, -1]
    assert ints_attribute(inner, REUSE) == [-1, 0]  # inside the forward: a view ORT plans as one
    assert ints_attribute(foreign, REUSE) == [-1, 0]  # not ort_zero's: its Function cannot be told
    assert passthrough.returns_copies(PostForwardBridge, 102)
    assert not passthrough.returns_copies(PostForwardBridge, 101)


def test_a_function_told_to_copy_returns_new_storage() -> None:
    passthrough.return_copies(qualified_name(EndStep), (9001,))
    tensors = (torch.ones(3), torch.zeros(2))

    class Ctx:
        needs_input_grad = (False, True, True)

        def set_materialize_grads(self, value: bool) -> None:
            pass

    copied = passthrough.passed_through(Ctx(), tensors, passthrough.returns_copies(EndStep, 9001))
    viewed = passthrough.passed_through(Ctx(), tensors, passthrough.returns_copies(EndStep, 9002))

    assert all(c.data_ptr() != t.data_ptr() and torch.equal(c, t) for c, t in zip(copied, tensors, strict=True))
    assert all(v.data_ptr() == t.data_ptr() for v, t in zip(viewed, tensors, strict=True))
