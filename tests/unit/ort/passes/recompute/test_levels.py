"""The layer-wise recompute pass at each level on the hand-built graphs (`tests/unit/ort/passes/conftest.py`): what
is recomputed, what is kept and reported."""

from __future__ import annotations

import importlib
import logging

import onnx
import pytest
from onnx import helper

import ort_zero  # noqa: E402, F401, I001  (before ORT: makes ORTModule importable on today's torch)

importlib.import_module("onnxruntime.training.ortmodule")

from ort_zero.ort.passes.backward_gather import forward_gathered_reads  # noqa: E402
from ort_zero.ort.passes.recompute import (  # noqa: E402
    LAYER_PLAN,
    MODULE_PLAN,
    RECOMPUTE_SUFFIX,
    recompute_record,
    recompute_regions,
    seed_dropouts,
)
from ort_zero.ort.step.torch_kernels import ScaledDotProductAttention  # noqa: E402
from ort_zero.python_op import function_name, ints_attribute  # noqa: E402
from ort_zero.zero3 import state as zero3_state  # noqa: E402
from ort_zero.zero3.ort_bridges import RecomputeStartBridge  # noqa: E402

from ..conftest import FOREIGN, Call, Keys, layer_calls, training_graph  # noqa: E402
from .conftest import (  # noqa: E402
    assert_well_formed,
    backward_reads,
    bridges_of,
    by_name,
    copies,
    descendants,
    forward_names,
    params_bridges,
    region_values,
    seeds,
)

LOGGER = "ort_zero.ort.passes.recompute"
NOTHING_RECOMPUTED = {"level": 0, "layers": [], "plans": {}, "recomputed_nodes": 0, "recomputed_python_ops": {}}


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
