"""The training-graph pass that has the YieldOp read model outputs from the kernels that made them
(`ort_zero.ort.passes.yield_from_makers`), on hand-built graphs; with `passthrough_buffers`, which then returns copies
only of what the YieldOp still reads from a bridge. That it saves a logits-sized buffer is measured on 2 ranks in
`tests/distributed/test_output_memory.py`.
"""

from __future__ import annotations

import importlib

import onnx
from onnx import helper

import ort_zero  # noqa: E402, F401, I001  (before ORT: makes ORTModule importable on today's torch)

importlib.import_module("onnxruntime.training.ortmodule")

from ort_zero.hooks import passthrough  # noqa: E402
from ort_zero.ort.passes.passthrough_buffers import plan_passthrough_buffers  # noqa: E402
from ort_zero.ort.passes.yield_from_makers import read_from_makers  # noqa: E402
from ort_zero.python_op import MS_DOMAIN, function_name, ints_attribute  # noqa: E402
from ort_zero.zero3.bridges import PostForwardBridge  # noqa: E402

from .conftest import REUSE, pass_through  # noqa: E402

POST = function_name(PostForwardBridge)


def test_the_yield_op_reads_a_model_output_from_its_maker_through_every_bridge() -> None:
    """Logits made by a kernel, passed on by the lm_head's bridge and then the model's with the loss: the YieldOp
    reads the kernel's logits and the model's copy of the (scalar) loss; a model output that is a graph input stays
    a copy."""
    head = pass_through(POST, "head", ["logits"], key=321)
    model = pass_through(POST, "model", ["loss", "head_0", "ids"], key=322)
    yield_op = helper.make_node("YieldOp", ["model_0", "model_1", "model_2"], ["g0", "g1", "g2"], "yield",
                                domain=MS_DOMAIN)  # fmt: skip
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["h", "w"], ["logits"], "lm_head"), head, model, yield_op],
        "g",
        [helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, [2, 8])],
        [],
        value_info=[helper.make_tensor_value_info("model_0", onnx.TensorProto.FLOAT, [])],
    )
    feeds = read_from_makers(graph)
    plans = passthrough.BufferPlans()
    plan_passthrough_buffers(graph, plans, feeds)
    by_name = {node.name: node for node in graph.node}  # the graph holds copies of the nodes
    assert list(by_name["yield"].input) == ["model_0", "logits", "model_2"]
    assert ints_attribute(by_name["head"], REUSE) == [-1, 0]
    assert ints_attribute(by_name["model"], REUSE) == [-1, -1, 1, -1]
    assert plans.planned(POST, (322,)).copied == {0, 2} and plans.planned(POST, (321,)).copied == set()
    plans.forget()
