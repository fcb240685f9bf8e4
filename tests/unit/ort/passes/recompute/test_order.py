"""The layer-wise recompute pass's order and seeds: nothing it adds runs before its region's anchor, no backward read
of a forward gather is left, Dropout seeds are reproducible, deep layers and level 2's choices."""

from __future__ import annotations

import importlib

import pytest
import torch
from onnx import helper

import ort_zero  # noqa: E402, F401, I001  (before ORT: makes ORTModule importable on today's torch)

importlib.import_module("onnxruntime.training.ortmodule")

from ort_zero.ort.passes.backward_gather import forward_gathered_reads, regather_for_backward  # noqa: E402
from ort_zero.ort.passes.recompute import (  # noqa: E402
    LAYER_PLAN,
    RECOMPUTE_SUFFIX,
    recompute_record,
    recompute_regions,
    seed_dropouts,
)
from ort_zero.python_op import function_name, function_name_of  # noqa: E402
from ort_zero.zero3.ort_bridges import RecomputeParamsBridge, RecomputeStartBridge  # noqa: E402

from ..conftest import FLOAT, Call, Keys, layer_calls, training_graph  # noqa: E402
from .conftest import assert_well_formed, backward_reads, bridges_of, descendants, region_values, seeds  # noqa: E402


def test_after_the_backward_regather_no_backward_read_of_a_forward_gather_is_left(keys: Keys) -> None:
    """The passes in ort_zero's order (training_manager.graph_optimizers): the re-gather, then the recompute."""
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
