"""The re-gather pass on a small hand-built training graph: one module whose backward reads its weight, directly and
through views, before and after the pass; and a read no module's backward precedes, which must be reported."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterator

import onnx
import pytest
import torch
from onnx import TensorProto, helper

import ort_zero  # noqa: E402, F401, I001  (before ORT: makes ORTModule importable on today's torch)

importlib.import_module("onnxruntime.training.ortmodule")

from ort_zero.ort.passes.backward_gather import forward_gathered_reads, regather_for_backward  # noqa: E402
from ort_zero.python_op import MS_DOMAIN, function_name, function_name_of  # noqa: E402
from ort_zero.zero3 import external_params  # noqa: E402
from ort_zero.zero3 import state as zero3_state  # noqa: E402
from ort_zero.zero3.bridges import PostForwardBridge, PreForwardBridge  # noqa: E402
from ort_zero.zero3.ort_bridges import BackwardParamsBridge  # noqa: E402

FLOAT = TensorProto.FLOAT


def module_state(ds_id: int, weight: torch.nn.Parameter | None = None) -> zero3_state.ModuleState:
    """A module (with `weight` as its one parameter, if given) as DeepSpeed and the subscriber leave it."""
    from deepspeed.runtime.zero.partition_parameters import _init_external_params

    module = torch.nn.Module()
    module.ds_id = ds_id
    if weight is not None:
        module.weight = weight
    _init_external_params(module)
    state = zero3_state.register(module, offload=None)
    state.exported_params = [weight] if weight is not None else []
    return state


@pytest.fixture
def states() -> Iterator[tuple[zero3_state.ModuleState, zero3_state.ModuleState]]:
    """A module whose one partitioned parameter (a 4x4 weight) its bridges gather, and its parent, without any."""
    weight = torch.nn.Parameter(torch.empty(0))
    weight.ds_id, weight.ds_shape = 0, torch.Size([4, 4])
    made = (module_state(1, weight), module_state(0))
    yield made
    for state in made:
        zero3_state.unregister(state)


@pytest.fixture
def key(states: tuple[zero3_state.ModuleState, zero3_state.ModuleState]) -> int:
    return states[0].key


def python_op(func: type, inputs: list[str], outputs: list[str], scalars: list[int]) -> onnx.NodeProto:
    return helper.make_node(
        "PythonOp", inputs, outputs, outputs[1], domain=MS_DOMAIN, func_name=function_name(func),
        input_int_scalars=scalars, output_tensor_ranks=[2] * (len(outputs) - 1),
        output_tensor_types=[FLOAT] * (len(outputs) - 1),
    )  # fmt: skip


def grad_op(ctx: str, inputs: list[str], outputs: list[str]) -> onnx.NodeProto:
    return helper.make_node(
        "PythonOpGrad", [ctx, *inputs], outputs, f"{outputs[0]}_node", domain=MS_DOMAIN,
        output_tensor_ranks=[2] * len(outputs), output_tensor_types=[FLOAT] * len(outputs),
    )  # fmt: skip


def training_graph(key: int, extra_backward: list[onnx.NodeProto] = ()) -> onnx.GraphProto:
    """y = x @ W.T inside a module; the backward reads W.T (a forward view) and W.T.T (a view made outside the
    forward), as ORT's gradient builders do."""
    nodes = [
        python_op(PreForwardBridge, ["x", "placeholder"], ["pre_ctx", "x1", "w"], [key, 1]),
        helper.make_node("Transpose", ["w"], ["wt"], "forward_view"),
        helper.make_node("MatMul", ["x1", "wt"], ["y"], "forward_matmul"),
        python_op(PostForwardBridge, ["y"], ["post_ctx", "y1"], [key]),
        helper.make_node("YieldOp", ["y1"], ["dy1"], "yield", domain=MS_DOMAIN),
        grad_op("post_ctx", ["dy1"], ["dy"]),
        helper.make_node("Transpose", ["wt"], ["wtt"], "backward_view"),
        helper.make_node("MatMul", ["dy", "wtt"], ["dx"], "input_grad"),
        helper.make_node("MatMul", ["dy", "wt"], ["dx_other"], "second_read"),
        helper.make_node("Add", ["dx", "dx_other"], ["dx_sum"], "sum"),
        *extra_backward,
        grad_op("pre_ctx", ["dx_sum"], ["x_grad"]),
    ]
    return helper.make_graph(
        nodes, "training", [helper.make_tensor_value_info(n, FLOAT, None) for n in ("x", "placeholder")],
        [helper.make_tensor_value_info("x_grad", FLOAT, None)],
    )  # fmt: skip


def test_backward_reads_of_the_forward_copy_are_found_and_moved_to_a_regather(key: int) -> None:
    graph = training_graph(key)
    assert sorted(forward_gathered_reads(graph)) == ["input_grad <- wtt", "second_read <- wt"]

    report = regather_for_backward(graph)

    assert (report.regathers, report.rewired_reads, report.kept) == (1, 2, [])
    assert forward_gathered_reads(graph) == []
    nodes = {node.name: node for node in graph.node}
    [regather] = [node for node in graph.node if function_name_of(node) == function_name(BackwardParamsBridge)]
    assert list(regather.input) == ["dy"], "the re-gather must run after the gather in PostForwardBridge's backward"
    # Both reads now come from the re-gathered weight through views re-done in the backward.
    redone_t = next(n for n in graph.node if n.op_type == "Transpose" and n.input[0] == regather.output[1])
    assert nodes["second_read"].input[1] == redone_t.output[0]
    redone_tt = next(n for n in graph.node if n.op_type == "Transpose" and n.input[0] == redone_t.output[0])
    assert nodes["input_grad"].input[1] == redone_tt.output[0]
    assert "backward_view" not in nodes, "the view of the forward copy is unused and must be gone"
    assert nodes["forward_view"].input[0] == "w", "the forward keeps reading its own copy"
    order = [node.name for node in graph.node]
    assert order.index("dy_node") < order.index(regather.name) < order.index("input_grad")


def test_a_read_no_module_backward_precedes_keeps_the_forward_copy_and_is_reported(
    key: int, caplog: pytest.LogCaptureFixture
) -> None:
    # Reads the weight from the YieldOp's gradient directly: no PostForwardBridge backward (no gather) before it.
    early = helper.make_node("MatMul", ["dy1", "w"], ["early"], "early_read")
    graph = training_graph(key, [early])

    with caplog.at_level(logging.WARNING, logger="ort_zero.ort.passes.backward_gather"):
        report = regather_for_backward(graph)

    assert report.kept == ["early_read <- w"]
    assert forward_gathered_reads(graph) == ["early_read <- w"]
    assert "keep the forward's gathered copies alive" in caplog.text


def test_a_graph_without_bridges_is_left_alone() -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], "relu")], "plain", [helper.make_tensor_value_info("x", FLOAT, None)],
        [helper.make_tensor_value_info("y", FLOAT, None)],
    )  # fmt: skip
    before = graph.SerializeToString()
    assert regather_for_backward(graph).regathers == 0
    assert graph.SerializeToString() == before


def test_a_parent_reading_a_childs_weight_gets_it_registered_and_regathered(
    states: tuple[zero3_state.ModuleState, zero3_state.ModuleState],
) -> None:
    """The parent's backward reads the child's weight (as a parent computing with `self.child.weight` does):
    DeepSpeed would have registered it as the parent's external parameter at the first eager forward; the pass
    plans that (the training manager registers it before the session runs) and serves the read from the parent's
    re-gather."""
    child, parent = states
    graph = training_graph(child.key)
    # The parent wraps the child's output: its PostForwardBridge backward runs first, then reads the weight.
    nodes = list(graph.node)
    yield_index = next(i for i, n in enumerate(nodes) if n.op_type == "YieldOp")
    nodes[yield_index].input[0] = "z1"
    nodes.insert(yield_index, python_op(PostForwardBridge, ["y1"], ["outer_ctx", "z1"], [parent.key]))
    grad = next(n for n in nodes if n.op_type == "PythonOpGrad" and n.input[0] == "post_ctx")
    grad.input[1] = "dy_outer"
    nodes.insert(nodes.index(grad), grad_op("outer_ctx", ["dy1"], ["dy_outer"]))
    nodes.insert(nodes.index(grad), helper.make_node("MatMul", ["dy_outer", "w"], ["parent_read"], "parent_read"))
    nodes[-1].input[1] = "dx_sum"
    nodes.insert(len(nodes) - 1, helper.make_node("Add", ["parent_read", "dx_sum"], ["dx_all"], "parent_sum"))
    nodes[-1].input[1] = "dx_all"
    del graph.node[:]
    graph.node.extend(nodes)

    report = regather_for_backward(graph)

    assert report.kept == [] and forward_gathered_reads(graph) == []
    assert report.external == [(parent.module, child.module.weight)]
    assert list(parent.module.ds_external_parameters()) == [], "a pass edits the graph; the registering comes after"
    external_params.register_read_outside(report.external)
    assert [p for _, p in parent.module.ds_external_parameters()] == [child.module.weight]
    regathers = {n.input[0]: n for n in graph.node if function_name_of(n) == function_name(BackwardParamsBridge)}
    assert set(regathers) == {"dy_outer", "dy"}, "one re-gather after each module's PostForwardBridge backward"
    assert next(n for n in graph.node if n.name == "parent_read").input[1] == regathers["dy_outer"].output[1]


class GatheringOffload:
    """DeepSpeed's offload as far as a backward re-gather uses it: `pre_sub_module_backward_function` gathers."""

    def __init__(self) -> None:
        self.gathered: list[torch.nn.Module] = []

    def pre_sub_module_backward_function(self, module: torch.nn.Module) -> None:
        from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

        self.gathered.append(module)
        module.weight.ds_status = ZeroParamStatus.AVAILABLE


def test_parameters_missing_while_a_backward_is_pending_are_an_error(
    states: tuple[zero3_state.ModuleState, zero3_state.ModuleState],
) -> None:
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    state = states[0]
    state.offload = GatheringOffload()
    state.module.weight.ds_status = ZeroParamStatus.NOT_AVAILABLE
    with pytest.raises(RuntimeError, match="has not gathered"):
        BackwardParamsBridge.forward(None, state.key, torch.zeros(1), 0)
    assert state.offload.gathered == []
