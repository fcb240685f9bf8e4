"""How values and gradients travel unchanged through Identities and ort_zero's pass-through PythonOps
(`ort_zero.ort.graph.pass_through`), on a hand-built graph: a kernel's output through two bridges and an Identity,
and its gradient back through the bridges' gradient nodes."""

from __future__ import annotations

import importlib

import onnx
from onnx import helper

import ort_zero  # noqa: E402, F401, I001  (before ORT: makes ORTModule importable on today's torch)

importlib.import_module("onnxruntime.training.ortmodule")

from ort_zero.ort.graph.pass_through import GradientPaths, made_by, producers  # noqa: E402
from ort_zero.python_op import MS_DOMAIN, function_name  # noqa: E402
from ort_zero.zero3.bridges import PostForwardBridge  # noqa: E402

POST = function_name(PostForwardBridge)


def bridge(func: str, name: str, inputs: list[str], reuse: list[int]) -> onnx.NodeProto:
    outputs = [f"{name}_ctx", *(f"{name}_{i}" for i in range(len(inputs)))]
    return helper.make_node("PythonOp", inputs, outputs, name, domain=MS_DOMAIN, func_name=func,
                            input_int_scalars=[7], tensor_reuse_map=reuse)  # fmt: skip


def graph() -> onnx.GraphProto:
    inner = bridge(POST, "inner", ["logits"], [-1, 0])
    outer = bridge(POST, "outer", ["inner_0", "h"], [-1, 0, -1])  # output 1 is new, not input 1
    foreign = bridge("user_code.Fn", "foreign", ["outer_0"], [-1, 0])
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["logits"], "kernel"),
        inner,
        outer,
        foreign,
        helper.make_node("Identity", ["outer_0"], ["out"], "name_it"),
        helper.make_node("PythonOpGrad", ["outer_ctx", "d_out", ""], ["d_inner_0", "d_h"], domain=MS_DOMAIN),
        helper.make_node("PythonOpGrad", ["inner_ctx", "d_inner_0"], ["d_logits"], domain=MS_DOMAIN),
        helper.make_node("Mul", ["d_logits", "x"], ["d_w"], "uses_it"),
    ]
    return helper.make_graph(nodes, "g", [], [])


def test_a_value_is_followed_to_the_kernel_that_made_it() -> None:
    g = graph()
    producer = producers(g)
    assert made_by("out", producer) == "logits"  # the Identity, then both bridges
    assert made_by("outer_1", producer) == "outer_1"  # not an alias of an input: the bridge made it
    assert made_by("foreign_0", producer) == "foreign_0"  # a Function of the user's computes


def test_a_gradient_is_followed_through_the_bridges_gradient_nodes() -> None:
    paths = GradientPaths.of(graph())
    assert paths.everything_made_of({"d_out"}) == {"d_out", "d_inner_0", "d_logits"}  # not d_w: Mul computes
