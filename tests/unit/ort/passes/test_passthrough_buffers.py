"""The training-graph pass that leaves ORT's buffer plan the only owner of ort_zero's pass-through outputs
(`ort_zero.ort.passes.passthrough_buffers`), on hand-built graphs. That it frees memory is measured on 2 ranks in
`tests/distributed/test_recompute.py` and `test_zero3_memory.py`.
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
from ort_zero.ort.step.functions import ParamPull  # noqa: E402
from ort_zero.python_op import MS_DOMAIN, function_name, ints_attribute  # noqa: E402
from ort_zero.zero3.bridges import PostForwardBridge  # noqa: E402

from .conftest import REUSE, pass_through  # noqa: E402

POST = function_name(PostForwardBridge)


def gradient_of(node: onnx.NodeProto, grads: list[str], outputs: list[str]) -> onnx.NodeProto:
    return helper.make_node("PythonOpGrad", [node.output[0], *grads], outputs, f"{node.name}_grad",
                            domain=MS_DOMAIN, func_name=string_attr(node, "func_name"))  # fmt: skip


def string_attr(node: onnx.NodeProto, name: str) -> str:
    return next(a.s.decode() for a in node.attribute if a.name == name)


def test_the_pass_plans_views_copies_and_gradients() -> None:
    inner = pass_through(POST, "inner", ["h", "m"], key=301)
    again = pass_through(POST, "again", ["h2", "m2"], key=301)  # the same module called twice
    outer = pass_through(POST, "outer", ["inner_0", "loss"], key=302)
    foreign = pass_through("user_code.Fn", "foreign", ["z"], key=303)
    not_pass_through = pass_through(function_name(ParamPull), "pull", ["w"], key=304)
    nodes = [
        inner,
        again,
        outer,
        foreign,
        not_pass_through,
        helper.make_node("Identity", ["outer_0"], ["output-0"], "out0"),
        helper.make_node(
            "YieldOp", ["output-0", "outer_1", "foreign_0"], ["g0", "g1", "g2"], "yield", domain=MS_DOMAIN
        ),
        gradient_of(outer, ["g0", "g1"], ["d_inner_0", "d_loss"]),
        gradient_of(inner, ["d_inner_0", "d_m"], ["d_h", "d_m_in"]),
        gradient_of(again, ["d_again_0", ""], ["d_h2", "d_m2_in"]),  # output 1 got no gradient here
        gradient_of(foreign, ["g2"], ["d_z"]),
    ]
    graph = helper.make_graph(nodes, "g", [], [helper.make_tensor_value_info("d_h", onnx.TensorProto.FLOAT, None)])

    plans = passthrough.BufferPlans()
    plan = plan_passthrough_buffers(graph, plans, read_from_makers(graph))
    by_name = {node.name: node for node in graph.node}

    assert plan.python_ops == 3  # not the foreign Function's, nor ort_zero's that do not pass through
    assert ints_attribute(by_name["foreign"], REUSE) == [-1, 0] and ints_attribute(by_name["pull"], REUSE) == [-1, 0]

    # forward: the YieldOp reads one model output from the node that feeds it (even through an Identity), which
    # copies it; the other from the value the node passes on (`loss`), which the node returns as a view
    assert [n.input for n in graph.node if n.op_type == "YieldOp"] == [["output-0", "loss", "foreign_0"]]
    assert plan.copied_outputs == ["outer"]
    assert ints_attribute(by_name["outer"], REUSE) == [-1, -1, 1]
    assert ints_attribute(by_name["inner"], REUSE) == [-1, 0, 1]
    assert plans.planned(POST, (302,)).copied == {0} and plans.planned(POST, (301,)).copied == set()
    assert plans.planned(function_name(ParamPull), (304,)) is None

    # backward: model outputs' gradients are copies. Key 301: input 0's gradient is a graph output in one node
    # (d_h), input 1's output got no gradient in the other: the Python call cannot tell the nodes apart, so neither
    # gradient is borrowed in any
    assert ints_attribute(by_name["outer_grad"], REUSE) == [-1, -1]
    assert ints_attribute(by_name["inner_grad"], REUSE) == [-1, -1]
    assert ints_attribute(by_name["again_grad"], REUSE) == [-1, -1]
    assert plans.planned(POST, (301,)).borrowed_grads == frozenset()
    assert plan.borrowed_grads == 0
    plans.forget()


def test_gradients_are_borrowed_where_every_node_of_the_pythonop_has_them() -> None:
    first = pass_through(POST, "first", ["a", "b"], key=311)
    second = pass_through(POST, "second", ["c", "d"], key=311)
    graph = helper.make_graph(
        [
            first,
            second,
            gradient_of(first, ["g_a", "g_b"], ["d_a", "d_b"]),
            gradient_of(second, ["g_c", ""], ["d_c", "d_d"]),
        ],
        "g",
        [],
        [],
    )
    plans = passthrough.BufferPlans()
    plan = plan_passthrough_buffers(graph, plans, read_from_makers(graph))
    first_grad, second_grad = graph.node[2:]
    assert ints_attribute(first_grad, REUSE) == [1, -1]  # output 1's gradient (input 1) is input 0's gradient
    assert ints_attribute(second_grad, REUSE) == [1, -1]
    assert plans.planned(POST, (311,)).borrowed_grads == frozenset({0})
    assert plan.borrowed_grads == 2
    plans.forget()
