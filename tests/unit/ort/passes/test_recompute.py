"""The layer-wise recompute pass on small hand-built training graphs.

The model: a root module holding a ModuleList of two like layers (each with an inner module owning one partitioned
4x4 weight) and a final module outside the layers that owns a weight too. Each layer's forward region is
    layer PreForwardBridge -> inner PreForwardBridge (gathers W) -> MatMul(x, W) -> Dropout
    -> inner PostForwardBridge -> layer PostForwardBridge
and its backward, as ORT's gradient graph has it: PythonOpGrad anchors for the PostForwardBridges, a DropoutGrad
reading the forward's mask, a Mul reading the MatMul's output, the input gradient through a Transpose of W and the
weight gradient through a Reshape and Transpose of the layer's input: views computed from forward values alone
("floating" nodes, neither forward nor descendants of the YieldOp).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import onnx
import pytest
import torch
from onnx import TensorProto, helper

import ort_zero  # noqa: E402, F401, I001  (before ORT: makes ORTModule importable on today's torch)

importlib.import_module("onnxruntime.training.ortmodule")

from ort_zero.ort.passes.backward_gather import forward_gathered_reads, regather_for_backward  # noqa: E402
from ort_zero.ort.passes.recompute import (  # noqa: E402
    LAYER_PLAN,
    MODULE_PLAN,
    RECOMPUTE_SUFFIX,
    recompute_record,
    recompute_regions,
    seed_dropouts,
)
from ort_zero.ort.torch_kernels import ScaledDotProductAttention  # noqa: E402
from ort_zero.python_op import MS_DOMAIN, function_name, function_name_of, ints_attribute  # noqa: E402
from ort_zero.zero3 import state as zero3_state  # noqa: E402
from ort_zero.zero3.bridges import PostForwardBridge, PreForwardBridge, StepStartBridge  # noqa: E402
from ort_zero.zero3.ort_bridges import RecomputeParamsBridge, RecomputeStartBridge  # noqa: E402

FLOAT = TensorProto.FLOAT
LOGGER = "ort_zero.ort.passes.recompute"
NOTHING_RECOMPUTED = {"level": 0, "layers": [], "plans": {}, "recomputed_nodes": 0, "recomputed_python_ops": {}}
FOREIGN = "user_code.ScaleFunction"  # an autograd Function of the user's: a PythonOp that is not an ort_zero bridge


# ----------------------------------------------------------------------------------------------------------------
# The model and its module states


class Inner(torch.nn.Module):
    """A module with one partitioned parameter, as DeepSpeed leaves it: an empty tensor with `ds_shape` 4x4."""

    def __init__(self, ds_id: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(0))
        self.weight.ds_id, self.weight.ds_shape = ds_id, torch.Size([4, 4])


class Layer(torch.nn.Module):
    def __init__(self, ds_id: int) -> None:
        super().__init__()
        self.inner = Inner(ds_id)


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([Layer(0), Layer(1)])
        self.final = Inner(2)


@dataclass
class Keys:
    """Module-state keys of the model's modules (the bridges' first integer scalar)."""

    root: int
    layers: list[int]
    inners: list[int]
    final: int


@pytest.fixture
def model() -> Iterator[tuple[Model, Keys]]:
    from deepspeed.runtime.zero.partition_parameters import _init_external_params

    model = Model()
    states = {}
    for ds_id, module in enumerate(model.modules()):
        module.ds_id = ds_id
        _init_external_params(module)
        state = zero3_state.register(module, offload=None)
        state.exported_params = list(module.parameters(recurse=False))
        states[module] = state
    keys = Keys(
        root=states[model].key,
        layers=[states[layer].key for layer in model.layers],
        inners=[states[layer.inner].key for layer in model.layers],
        final=states[model.final].key,
    )
    yield model, keys
    for state in states.values():
        zero3_state.unregister(state)


@pytest.fixture
def keys(model: tuple[Model, Keys]) -> Keys:
    return model[1]


# ----------------------------------------------------------------------------------------------------------------
# Building training graphs


def python_op(func: str, name: str, inputs: list[str], outputs: list[str], scalars: list[int]) -> onnx.NodeProto:
    """A PythonOp as ORT's exporter writes it (output 0 is the autograd context)."""
    scalar_attributes = {"input_int_scalars": scalars} if scalars else {}
    return helper.make_node(
        "PythonOp", inputs, outputs, name, domain=MS_DOMAIN, func_name=func, **scalar_attributes,
        input_tensor_ranks=[2] * len(inputs), input_tensor_types=[FLOAT] * len(inputs),
        output_tensor_ranks=[2] * (len(outputs) - 1), output_tensor_types=[FLOAT] * (len(outputs) - 1),
    )  # fmt: skip


def bridge(func: type, name: str, inputs: list[str], outputs: list[str], scalars: list[int]) -> onnx.NodeProto:
    return python_op(function_name(func), name, inputs, outputs, scalars)


def grad_op(name: str, ctx: str, inputs: list[str], outputs: list[str]) -> onnx.NodeProto:
    return helper.make_node(
        "PythonOpGrad", [ctx, *inputs], outputs, name, domain=MS_DOMAIN,
        output_tensor_ranks=[2] * len(outputs), output_tensor_types=[FLOAT] * len(outputs),
    )  # fmt: skip


@dataclass
class Call:
    """One run of a layer's forward in the graph: `tag` prefixes its node and value names."""

    tag: str
    layer: int  # the layer's key
    inner: int  # its inner module's key
    foreign: str | None = None  # where a foreign PythonOp sits: "before_dropout" or "before_inner"
    function: str = FOREIGN  # the Function that PythonOp runs


class TrainingGraph:
    """Forward and backward node lists of a hand-built training graph."""

    def __init__(self) -> None:
        self.forward: list[onnx.NodeProto] = []
        self.backward: list[onnx.NodeProto] = []
        self.placeholders: list[str] = []
        self.grads: list[str] = []

    def layer_forward(self, call: Call, x: str) -> str:
        t, fwd = call.tag, self.forward.append
        inner_input = f"{t}_x"
        fwd(bridge(PreForwardBridge, f"{t}_pre", [x], [f"{t}_pre_ctx", f"{t}_x"], [call.layer, 1]))
        if call.foreign == "before_inner":  # e.g. a fused attention Function feeding an output projection
            fwd(python_op(call.function, f"{t}_foreign", [f"{t}_x"], [f"{t}_foreign_ctx", f"{t}_xf"], []))
            inner_input = f"{t}_xf"
        self.placeholders.append(f"{t}_placeholder")
        fwd(
            bridge(
                PreForwardBridge,
                f"{t}_inner_pre",
                [inner_input, f"{t}_placeholder"],
                [f"{t}_inner_pre_ctx", f"{t}_xi", f"{t}_w"],
                [call.inner, 1],
            )
        )
        fwd(helper.make_node("MatMul", [f"{t}_xi", f"{t}_w"], [f"{t}_h"], f"{t}_matmul"))
        dropout_input = f"{t}_h"
        if call.foreign == "before_dropout":
            fwd(python_op(call.function, f"{t}_foreign", [f"{t}_h"], [f"{t}_foreign_ctx", f"{t}_hf"], []))
            dropout_input = f"{t}_hf"
        fwd(helper.make_node("Dropout", [dropout_input, "ratio", "training"], [f"{t}_d", f"{t}_mask"], f"{t}_dropout"))
        fwd(bridge(PostForwardBridge, f"{t}_inner_post", [f"{t}_d"], [f"{t}_inner_post_ctx", f"{t}_di"], [call.inner]))
        fwd(bridge(PostForwardBridge, f"{t}_post", [f"{t}_di"], [f"{t}_post_ctx", f"{t}_out"], [call.layer]))
        return f"{t}_out"

    def layer_backward(self, call: Call, grad: str) -> str:
        t, bwd = call.tag, self.backward.append
        bwd(grad_op(f"{t}_post_grad", f"{t}_post_ctx", [grad], [f"{t}_g_di"]))  # the region's anchor
        bwd(grad_op(f"{t}_inner_post_grad", f"{t}_inner_post_ctx", [f"{t}_g_di"], [f"{t}_g_d"]))
        dropout_grad = f"{t}_g_hf" if call.foreign == "before_dropout" else f"{t}_g_h0"
        bwd(
            helper.make_node(
                "DropoutGrad",
                [f"{t}_g_d", f"{t}_mask", "ratio", "training"],
                [dropout_grad],
                f"{t}_dropout_grad",
                domain=MS_DOMAIN,
            )
        )
        if call.foreign == "before_dropout":
            bwd(grad_op(f"{t}_foreign_grad", f"{t}_foreign_ctx", [f"{t}_g_hf"], [f"{t}_g_h0"]))
        bwd(helper.make_node("Mul", [f"{t}_g_h0", f"{t}_h"], [f"{t}_g_h"], f"{t}_act_grad"))  # reads the MatMul's
        bwd(helper.make_node("Transpose", [f"{t}_w"], [f"{t}_wt"], f"{t}_w_view"))  # floating
        bwd(helper.make_node("MatMul", [f"{t}_g_h", f"{t}_wt"], [f"{t}_g_xi"], f"{t}_dx"))
        bwd(helper.make_node("Reshape", [f"{t}_xi", "flat_shape"], [f"{t}_xflat"], f"{t}_x_flat"))  # floating
        bwd(helper.make_node("Transpose", [f"{t}_xflat"], [f"{t}_xflat_t"], f"{t}_x_flat_t"))  # floating
        bwd(helper.make_node("MatMul", [f"{t}_xflat_t", f"{t}_g_h"], [f"{t}_g_w"], f"{t}_dw"))
        inner_grads = [f"{t}_g_x", f"{t}_g_placeholder"]
        bwd(grad_op(f"{t}_inner_pre_grad", f"{t}_inner_pre_ctx", [f"{t}_g_xi", f"{t}_g_w"], inner_grads))
        self.grads.append(f"{t}_g_placeholder")
        layer_grad = f"{t}_g_x"
        if call.foreign == "before_inner":
            bwd(grad_op(f"{t}_foreign_grad", f"{t}_foreign_ctx", [f"{t}_g_x"], [f"{t}_g_x0"]))
            layer_grad = f"{t}_g_x0"
        bwd(grad_op(f"{t}_pre_grad", f"{t}_pre_ctx", [layer_grad], [f"{t}_g_in"]))
        return f"{t}_g_in"

    def final_forward(self, key: int, x: str) -> str:
        fwd = self.forward.append
        self.placeholders.append("final_placeholder")
        fwd(
            bridge(
                PreForwardBridge,
                "final_pre",
                [x, "final_placeholder"],
                ["final_pre_ctx", "final_x", "final_w"],
                [key, 1],
            )
        )
        fwd(helper.make_node("MatMul", ["final_x", "final_w"], ["final_h"], "final_matmul"))
        fwd(bridge(PostForwardBridge, "final_post", ["final_h"], ["final_post_ctx", "final_out"], [key]))
        return "final_out"

    def final_backward(self, grad: str) -> str:
        bwd = self.backward.append
        bwd(grad_op("final_post_grad", "final_post_ctx", [grad], ["final_g_h0"]))
        bwd(helper.make_node("Mul", ["final_g_h0", "final_h"], ["final_g_h"], "final_act_grad"))
        bwd(helper.make_node("Transpose", ["final_w"], ["final_wt"], "final_w_view"))
        bwd(helper.make_node("MatMul", ["final_g_h", "final_wt"], ["final_g_x"], "final_dx"))
        bwd(helper.make_node("Transpose", ["final_x"], ["final_xt"], "final_x_view"))
        bwd(helper.make_node("MatMul", ["final_xt", "final_g_h"], ["final_g_w"], "final_dw"))
        bwd(grad_op("final_pre_grad", "final_pre_ctx", ["final_g_x", "final_g_w"], ["final_g_in", "final_g_ph"]))
        self.grads.append("final_g_ph")
        return "final_g_in"


def training_graph(keys: Keys, calls: list[Call] | None = None) -> onnx.GraphProto:
    """StepStart -> root PreForward -> the layer calls -> final module -> root PostForward -> YieldOp, and the
    backward in reverse."""
    calls = calls if calls is not None else layer_calls(keys)
    built = TrainingGraph()
    built.forward.append(bridge(StepStartBridge, "step_start", ["x"], ["step_ctx", "x0"], [keys.root]))
    built.forward.append(bridge(PreForwardBridge, "root_pre", ["x0"], ["root_pre_ctx", "a0"], [keys.root, 1]))
    value = "a0"
    for call in calls:
        value = built.layer_forward(call, value)
    value = built.final_forward(keys.final, value)
    built.forward.append(bridge(PostForwardBridge, "root_post", [value], ["root_post_ctx", "y"], [keys.root]))
    built.forward.append(helper.make_node("YieldOp", ["y"], ["dy"], "yield", domain=MS_DOMAIN))

    built.backward.append(grad_op("root_post_grad", "root_post_ctx", ["dy"], ["g_final"]))
    grad = built.final_backward("g_final")
    for call in reversed(calls):
        grad = built.layer_backward(call, grad)
    built.backward.append(grad_op("root_pre_grad", "root_pre_ctx", [grad], ["g_x0"]))
    built.backward.append(grad_op("step_grad", "step_ctx", ["g_x0"], ["x_grad"]))
    return helper.make_graph(
        built.forward + built.backward, "training",
        [helper.make_tensor_value_info(name, FLOAT, None) for name in ("x", *built.placeholders)],
        [helper.make_tensor_value_info(name, FLOAT, None) for name in ("x_grad", *built.grads)],
        initializer=[
            helper.make_tensor("ratio", FLOAT, [], [0.1]),
            helper.make_tensor("training", TensorProto.BOOL, [], [True]),
            helper.make_tensor("flat_shape", TensorProto.INT64, [2], [-1, 4]),
        ],
    )  # fmt: skip


def layer_calls(keys: Keys, foreign: dict[int, str] | None = None) -> list[Call]:
    foreign = foreign or {}
    return [Call(f"l{i}", keys.layers[i], keys.inners[i], foreign.get(i)) for i in range(2)]


# ----------------------------------------------------------------------------------------------------------------
# Reading graphs


def by_name(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    return {node.name: node for node in graph.node}


def bridges_of(graph: onnx.GraphProto, func: type) -> dict[int, onnx.NodeProto]:
    """The `func` PythonOps by their first integer scalar (a region's key, or a module's)."""
    found = [node for node in graph.node if function_name_of(node) == function_name(func)]
    by_key = {ints_attribute(node, "input_int_scalars")[0]: node for node in found}
    assert len(by_key) == len(found), f"two {func.__name__} nodes for one key"
    return by_key


def params_bridges(graph: onnx.GraphProto) -> dict[int, onnx.NodeProto]:
    """RecomputeParamsBridge nodes by the key of the module whose parameters they gather."""
    return bridges_of(graph, RecomputeParamsBridge)


def copies(graph: onnx.GraphProto) -> list[str]:
    return sorted(node.name for node in graph.node if node.name.endswith(RECOMPUTE_SUFFIX))


def forward_names(graph: onnx.GraphProto) -> set[str]:
    """The nodes the YieldOp depends on (itself included)."""
    producer = {out: node for node in graph.node for out in node.output if out}
    yield_op = next(node for node in graph.node if node.op_type == "YieldOp")
    seen, stack = {yield_op.name}, [yield_op]
    while stack:
        for value in stack.pop().input:
            node = producer.get(value)
            if node is not None and node.name not in seen:
                seen.add(node.name)
                stack.append(node)
    return seen


def descendants(graph: onnx.GraphProto, name: str) -> set[str]:
    """The nodes that depend on node `name` (itself included)."""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for value in node.input:
            consumers.setdefault(value, []).append(node)
    start = by_name(graph)[name]
    seen, stack = {name}, [start]
    while stack:
        for value in stack.pop().output:
            for node in consumers.get(value, ()):
                if node.name not in seen:
                    seen.add(node.name)
                    stack.append(node)
    return seen


def region_values(calls: list[Call]) -> dict[str, set[str]]:
    """Per layer call, the values its forward region computes (not its inputs, not the autograd contexts)."""
    values = {}
    for call in calls:
        t = call.tag
        values[t] = {f"{t}_xi", f"{t}_w", f"{t}_h", f"{t}_d", f"{t}_mask", f"{t}_di"}
        if call.foreign == "before_dropout":
            values[t].add(f"{t}_hf")
        if call.foreign == "before_inner":
            values[t].add(f"{t}_xf")
    return values


def assert_well_formed(graph: onnx.GraphProto) -> None:
    """Topologically sorted, every value produced once, every input produced before its reader or given."""
    available = {value.name for value in graph.input} | {tensor.name for tensor in graph.initializer}
    for node in graph.node:
        missing = [value for value in node.input if value and value not in available]
        assert not missing, f"{node.name} reads {missing} before they are produced"
        produced_again = [value for value in node.output if value and value in available]
        assert not produced_again, f"{node.name} produces {produced_again} again"
        available.update(value for value in node.output if value)
    assert {value.name for value in graph.output} <= available


def backward_reads(graph: onnx.GraphProto, values: set[str]) -> list[str]:
    """'node <- value' for each read of `values` by a node that is not forward (backward, floating or added)."""
    forward = forward_names(graph)
    return [
        f"{node.name} <- {value}"
        for node in graph.node
        if node.name not in forward
        for value in node.input
        if value in values
    ]


def seeds(graph: onnx.GraphProto) -> dict[str, int]:
    return {
        node.name: next(a.i for a in node.attribute if a.name == "seed")
        for node in graph.node
        if node.op_type == "Dropout" and any(a.name == "seed" for a in node.attribute)
    }


# ----------------------------------------------------------------------------------------------------------------
# Tests


def test_the_hand_built_graph_has_what_the_pass_must_remove(keys: Keys) -> None:
    """Guards the tests below: before the pass the backward reads each layer's activations, mask, input and weight."""
    graph = training_graph(keys)
    assert_well_formed(graph)
    reads = backward_reads(graph, set().union(*region_values(layer_calls(keys)).values()))
    for t in ("l0", "l1"):
        assert {f"{t}_dropout_grad <- {t}_mask", f"{t}_act_grad <- {t}_h", f"{t}_x_flat <- {t}_xi"} <= set(reads)
    assert sorted(forward_gathered_reads(graph)) == ["final_dx <- final_wt", "l0_dx <- l0_wt", "l1_dx <- l1_wt"]
    assert recompute_record(graph) == NOTHING_RECOMPUTED


def test_level_0_only_seeds_the_dropouts(keys: Keys) -> None:
    graph = training_graph(keys)
    before = onnx.GraphProto()
    before.CopyFrom(graph)

    report = recompute_regions(graph, 0)

    assert (report.level, report.regions, report.recomputed_nodes, report.rewired_reads, report.kept) == (
        0, {}, 0, 0, [],
    )  # fmt: skip
    assert set(seeds(graph)) == {"l0_dropout", "l1_dropout"}, "every Dropout gets a seed, at level 0 too"
    for node in graph.node:  # without the seeds, the graph is the one given
        if node.op_type == "Dropout":
            kept = [a for a in node.attribute if a.name != "seed"]
            del node.attribute[:]
            node.attribute.extend(kept)
    assert graph.SerializeToString() == before.SerializeToString()
    assert recompute_record(graph) == NOTHING_RECOMPUTED


def test_level_1_recomputes_each_layer_in_its_backward(keys: Keys) -> None:
    graph = training_graph(keys)
    calls = layer_calls(keys)
    seed_dropouts(graph)
    forward_before = {node.name: node.SerializeToString() for node in graph.node if node.name in forward_names(graph)}

    report = recompute_regions(graph, 1)

    assert_well_formed(graph)
    assert report.regions == {"layers.0": LAYER_PLAN, "layers.1": LAYER_PLAN}
    assert report.kept == []
    # Per layer: the mask, the MatMul's output, the input (through the Reshape) and the weight (through a Transpose).
    assert report.rewired_reads == 8
    # No node outside the forward reads a value any layer's forward computed.
    assert backward_reads(graph, set().union(*region_values(calls).values())) == []
    # The forward is untouched.
    assert {n.name: n.SerializeToString() for n in graph.node if n.name in forward_before} == forward_before
    assert forward_names(graph) == set(forward_before)

    nodes = by_name(graph)
    expected_copies = [f"{t}_{op}{RECOMPUTE_SUFFIX}" for t in ("l0", "l1") for op in ("dropout", "matmul")]
    assert copies(graph) == expected_copies
    starts, params = bridges_of(graph, RecomputeStartBridge), params_bridges(graph)
    assert set(starts) == set(keys.layers), "one RecomputeStartBridge per layer, keyed by the layer"
    assert set(params) == set(keys.inners), "one RecomputeParamsBridge per inner module"
    weight_ids = {key: zero3_state.lookup(key).bridged_params()[0].ds_id for key in keys.inners}
    for i, t in enumerate(("l0", "l1")):
        start, param = starts[keys.layers[i]], params[keys.inners[i]]
        # The recompute starts where the backward enters the layer: after its PostForwardBridge's gradient node.
        assert start.input[0] in nodes[f"{t}_post_grad"].output
        assert list(start.input[1:]) == [("a0", "l0_out")[i]], "the recompute starts from the layer's input"
        assert start.doc_string == f"{LAYER_PLAN} layers.{i}"
        assert ints_attribute(param, "input_int_scalars") == [keys.inners[i], weight_ids[keys.inners[i]]]
        assert param.input[0] == start.output[1], "the weight is gathered again when the recompute reaches it"
        matmul, dropout = nodes[f"{t}_matmul{RECOMPUTE_SUFFIX}"], nodes[f"{t}_dropout{RECOMPUTE_SUFFIX}"]
        assert list(matmul.input) == [start.output[1], param.output[1]]
        assert matmul.input[1] != f"{t}_w", "a copy never reads the weight gathered in the forward"
        assert dropout.input[0] == matmul.output[0]
        assert seeds(graph)[f"{t}_dropout{RECOMPUTE_SUFFIX}"] == seeds(graph)[f"{t}_dropout"], "the forward's mask"
        # The backward's reads now come from the copies.
        assert nodes[f"{t}_dropout_grad"].input[1] == dropout.output[1]
        assert nodes[f"{t}_act_grad"].input[1] == matmul.output[0]
        assert nodes[f"{t}_x_flat"].input[0] == start.output[1], "the floating Reshape reads the recomputed input"
        assert nodes[f"{t}_w_view"].input[0] == param.output[1]
        # Everything added for the layer runs after its anchor.
        after_anchor = descendants(graph, f"{t}_post_grad")
        assert {start.name, param.name, matmul.name, dropout.name} <= after_anchor
    # Only the final module (no region at level 1) still reads its forward-gathered weight.
    assert forward_gathered_reads(graph) == ["final_dx <- final_wt"]

    record = recompute_record(graph)
    assert record["level"] == 1
    assert sorted(record["layers"]) == ["layers.0", "layers.1"]
    assert record["plans"] == {LAYER_PLAN: 2}
    assert record["recomputed_nodes"] == report.recomputed_nodes == 4


def test_a_foreign_python_op_inside_a_layer_is_kept_and_reported(keys: Keys, caplog: pytest.LogCaptureFixture) -> None:
    calls = layer_calls(keys, foreign={1: "before_dropout"})
    graph = training_graph(keys, calls)

    report = recompute_regions(graph, 1)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        report.log()

    assert_well_formed(graph)
    assert report.kept == [f"layers.1: l1_hf ({FOREIGN} runs Python)"]
    assert FOREIGN in caplog.text and "l1_hf" in caplog.text
    nodes = by_name(graph)
    # Its output is read in the backward as the forward made it, by the Dropout's copy (directly, or passed through
    # the layer's RecomputeStartBridge); its context by its gradient node.
    [read] = backward_reads(graph, {"l1_hf"})
    dropout, start = nodes[f"l1_dropout{RECOMPUTE_SUFFIX}"], bridges_of(graph, RecomputeStartBridge)[keys.layers[1]]
    assert read in (f"{dropout.name} <- l1_hf", f"{start.name} <- l1_hf")
    if dropout.input[0] != "l1_hf":
        assert start.input[list(start.output).index(dropout.input[0])] == "l1_hf"
    assert nodes["l1_foreign_grad"].input[0] == "l1_foreign_ctx"
    assert f"l1_foreign{RECOMPUTE_SUFFIX}" not in nodes, "a foreign PythonOp must never run twice"
    # What it does not make is still recomputed: the mask (from the kept output), the MatMul's output.
    assert nodes["l1_dropout_grad"].input[1] == f"l1_mask{RECOMPUTE_SUFFIX}"
    assert nodes["l1_act_grad"].input[1] == f"l1_h{RECOMPUTE_SUFFIX}"
    assert report.regions == {"layers.0": LAYER_PLAN, "layers.1": LAYER_PLAN}
    other = {k: v for k, v in region_values(calls).items() if k == "l0"}
    assert backward_reads(graph, set().union(*other.values())) == [], "the other layer is recomputed in full"


def test_a_torch_kernel_inside_a_layer_runs_again_and_its_forward_keeps_no_context(keys: Keys) -> None:
    calls = layer_calls(keys, foreign={1: "before_dropout"})
    calls[1].function = function_name(ScaledDotProductAttention)
    graph = training_graph(keys, calls)
    for node in graph.node:
        if node.name == "l1_foreign":
            node.attribute.append(helper.make_attribute("training_mode", 1))

    report = recompute_regions(graph, 1)

    assert_well_formed(graph)
    assert report.kept == []
    nodes = by_name(graph)
    copy = nodes[f"l1_foreign{RECOMPUTE_SUFFIX}"]
    assert copy.input[0] == f"l1_h{RECOMPUTE_SUFFIX}", "the copy runs on the recomputed MatMul"
    assert nodes["l1_foreign_grad"].input[0] == copy.output[0], "the gradient reads the copy's context"
    assert backward_reads(graph, {"l1_foreign_ctx", "l1_hf"}) == []
    training_mode = {a.name: a.i for a in nodes["l1_foreign"].attribute}["training_mode"]
    assert training_mode == 0, "the forward's kernel would keep a context nothing reads (ORT holds it forever)"
    assert {a.name: a.i for a in copy.attribute}["training_mode"] == 1
    assert recompute_record(graph)["recomputed_python_ops"] == {function_name(ScaledDotProductAttention): 1}


def test_level_2_also_recomputes_a_module_outside_the_layers(keys: Keys) -> None:
    graph = training_graph(keys)

    report = recompute_regions(graph, 2)

    assert_well_formed(graph)
    assert report.regions == {"layers.0": LAYER_PLAN, "layers.1": LAYER_PLAN, "final": MODULE_PLAN}
    nodes = by_name(graph)
    start, param = bridges_of(graph, RecomputeStartBridge)[keys.final], params_bridges(graph)[keys.final]
    assert start.input[0] in nodes["final_post_grad"].output
    assert list(start.input[1:]) == ["l1_out"]
    assert start.doc_string == f"{MODULE_PLAN} final"
    matmul = nodes[f"final_matmul{RECOMPUTE_SUFFIX}"]
    assert list(matmul.input) == [start.output[1], param.output[1]]
    assert nodes["final_act_grad"].input[1] == matmul.output[0]
    assert backward_reads(graph, {"final_h"}) == []
    assert {start.name, param.name, matmul.name} <= descendants(graph, "final_post_grad")
    assert backward_reads(graph, set().union(*region_values(layer_calls(keys)).values())) == []

    record = recompute_record(graph)
    assert record["level"] == 2
    assert sorted(record["layers"]) == ["final", "layers.0", "layers.1"]
    assert record["plans"] == {LAYER_PLAN: 2, MODULE_PLAN: 1}
    assert record["recomputed_nodes"] == report.recomputed_nodes == 5


@pytest.mark.parametrize("level", [1, 2])
def test_a_layer_whose_forward_runs_twice_is_skipped_and_reported(
    keys: Keys, level: int, caplog: pytest.LogCaptureFixture
) -> None:
    layer0 = (keys.layers[0], keys.inners[0])
    calls = [Call("l0a", *layer0), Call("l0b", *layer0), Call("l1", keys.layers[1], keys.inners[1])]
    graph = training_graph(keys, calls)

    report = recompute_regions(graph, level)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        report.log()

    assert_well_formed(graph)
    assert "layers.0: its forward runs 2 times in one step" in report.kept
    assert "layers.0" in caplog.text and "2 times" in caplog.text
    assert [path for path, plan in report.regions.items() if plan == LAYER_PLAN] == ["layers.1"]
    assert set(bridges_of(graph, RecomputeStartBridge)) == {keys.layers[1]} | ({keys.final} if level == 2 else set())
    assert recompute_record(graph)["plans"][LAYER_PLAN] == 1
    values = region_values(calls)
    assert backward_reads(graph, values["l1"]) == []
    # The skipped layer's backward reads its forward values as before.
    assert {"l0a_dropout_grad <- l0a_mask", "l0b_dropout_grad <- l0b_mask"} <= set(
        backward_reads(graph, values["l0a"] | values["l0b"])
    )


def test_after_the_backward_regather_no_backward_read_of_a_forward_gather_is_left(keys: Keys) -> None:
    """The passes in ort_zero's order (integration.graph_optimizers): the re-gather, then the recompute."""
    graph = training_graph(keys)
    regather_for_backward(graph)

    report = recompute_regions(graph, 1)

    assert_well_formed(graph)
    assert set(report.regions) == {"layers.0", "layers.1"}
    assert forward_gathered_reads(graph) == []
    assert backward_reads(graph, set().union(*region_values(layer_calls(keys)).values())) == []


def test_a_graph_without_bridges_is_left_alone() -> None:
    graph = helper.make_graph(
        [helper.make_node("Dropout", ["x"], ["y"], "dropout")], "plain",
        [helper.make_tensor_value_info("x", FLOAT, None)], [helper.make_tensor_value_info("y", FLOAT, None)],
    )  # fmt: skip
    before = graph.SerializeToString()
    assert recompute_regions(graph, 2).regions == {}
    assert graph.SerializeToString() == before


def test_dropout_seeds_are_reproducible_and_never_replaced(keys: Keys) -> None:
    torch.manual_seed(1)
    first, again = training_graph(keys), training_graph(keys)
    seed_dropouts(first)
    seed_dropouts(again)
    assert seeds(first) == seeds(again)
    assert seeds(first)["l0_dropout"] != seeds(first)["l1_dropout"]
    seed_dropouts(first)
    assert seeds(first) == seeds(again), "a second pass keeps the seeds"
    torch.manual_seed(2)
    other = training_graph(keys)
    seed_dropouts(other)
    assert seeds(other)["l0_dropout"] != seeds(first)["l0_dropout"], "the seeds follow torch's seed"


# ----------------------------------------------------------------------------------------------------------------
# Nodes added after kept foreign outputs still wait for the backward; a layer hundreds of ops deep is recomputed
# (the copying does not recurse per op); level 2 never looks inside layers


@pytest.mark.parametrize("foreign", ["before_dropout", "before_inner"])
def test_everything_the_pass_adds_runs_after_its_regions_anchor(keys: Keys, foreign: str) -> None:
    graph = training_graph(keys, layer_calls(keys, foreign={1: foreign}))

    report = recompute_regions(graph, 1)

    assert report.regions["layers.1"] == LAYER_PLAN
    added = {
        node.name
        for node in graph.node
        if node.name.endswith(RECOMPUTE_SUFFIX)
        or function_name_of(node) in (function_name(RecomputeStartBridge), function_name(RecomputeParamsBridge))
    }
    layer1 = {name for name in added if "l1_" in name or name.endswith(f"_{keys.layers[1]}_{keys.inners[1]}")}
    layer1 |= {node.name for key, node in bridges_of(graph, RecomputeStartBridge).items() if key == keys.layers[1]}
    assert layer1, "the pass added nothing for layer 1"
    assert layer1 <= descendants(graph, "l1_post_grad"), "added nodes that do not wait for the layer's backward"
    assert "layers.1" in recompute_record(graph)["layers"]


def test_a_deep_layer_is_recomputed(keys: Keys) -> None:
    graph = training_graph(keys)
    nodes = list(graph.node)
    matmul = next(i for i, node in enumerate(nodes) if node.name == "l0_matmul")
    depth = 600  # ops between the MatMul and the Dropout, one after another
    chain = [helper.make_node("Relu", [f"l0_c{j}"], [f"l0_c{j + 1}"], f"l0_relu{j}") for j in range(depth)]
    nodes[matmul].output[0], chain[-1].output[0] = "l0_c0", "l0_h"
    nodes[matmul + 1 : matmul + 1] = chain
    del graph.node[:]
    graph.node.extend(nodes)

    report = recompute_regions(graph, 1)

    assert_well_formed(graph)
    assert report.regions == {"layers.0": LAYER_PLAN, "layers.1": LAYER_PLAN}
    assert report.recomputed_nodes == 4 + depth


def test_level_2_considers_no_module_inside_a_layer(keys: Keys) -> None:
    layer0 = (keys.layers[0], keys.inners[0])
    calls = [Call("l0a", *layer0), Call("l0b", *layer0), Call("l1", keys.layers[1], keys.inners[1])]
    graph = training_graph(keys, calls)

    report = recompute_regions(graph, 2)

    assert report.kept == ["layers.0: its forward runs 2 times in one step"]
