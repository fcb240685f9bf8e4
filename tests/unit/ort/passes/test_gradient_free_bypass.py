"""The gradient-free bypass on hand-built exported graphs: a layer's bridge carries cos beside the hidden states."""

from __future__ import annotations

import importlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

import ort_zero  # noqa: E402, F401, I001  (before ORT: makes ORTModule importable on today's torch)

importlib.import_module("onnxruntime.training.ortmodule")

from ort_zero.ort.passes.gradient_free_bypass import bypass_gradient_free_outputs  # noqa: E402
from ort_zero.python_op import function_name, make_python_op  # noqa: E402
from ort_zero.zero3.bridges import PostForwardBridge, PreForwardBridge  # noqa: E402

FLOAT, INT64 = TensorProto.FLOAT, TensorProto.INT64
PRE, POST = function_name(PreForwardBridge), function_name(PostForwardBridge)


def bridge(func: str, name: str, key: int, inputs: list[tuple[str, int]], outputs: list[str]) -> onnx.NodeProto:
    scalars = [key, len(inputs)] if func == PRE else [key]
    return make_python_op(
        func,
        name,
        scalars,
        [(v, 2, t) for v, t in inputs],
        [(o, 2, t) for o, (_, t) in zip(outputs, inputs, strict=True)],
    )


def rotary_and_layer() -> onnx.GraphProto:
    """`hidden` (a float input: reachable) and `positions` (int64) enter; the rotary module (key 1) makes cos from the
    positions alone; the layer (key 2) reads the hidden states and cos through its bridges."""
    nodes = [
        bridge(PRE, "rotary_pre", 1, [("hidden", FLOAT), ("positions", INT64)], ["hidden_r", "positions_r"]),
        helper.make_node("Cast", ["positions_r"], ["positions_f"], "cast", to=FLOAT),
        helper.make_node("Cos", ["positions_f"], ["cos_raw"], "cos"),
        bridge(POST, "rotary_post", 1, [("cos_raw", FLOAT)], ["cos"]),
        bridge(PRE, "layer_pre", 2, [("hidden", FLOAT), ("cos", FLOAT)], ["hidden_l", "cos_l"]),
        helper.make_node("Mul", ["hidden_l", "cos_l"], ["rotated"], "mul"),
        bridge(POST, "layer_post", 2, [("rotated", FLOAT)], ["out"]),
    ]
    return helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("hidden", FLOAT, [2, 2]),
            helper.make_tensor_value_info("positions", INT64, [2, 2]),
        ],
        [helper.make_tensor_value_info("out", FLOAT, [2, 2])],
        value_info=[
            helper.make_tensor_value_info(name, elem, [2, 2])
            for name, elem in [("positions_r", INT64), ("positions_f", FLOAT), ("cos_raw", FLOAT), ("cos", FLOAT)]
        ],
    )


def reader_of(graph: onnx.GraphProto, name: str) -> list[str]:
    return list(next(node for node in graph.node if node.name == name).input)


def test_a_value_without_a_gradient_passes_around_the_bridge_it_rode_beside_one_with() -> None:
    """cos rides the layer's bridge beside the hidden states: ORT would take the bridge's cos as differentiable and
    keep the Mul's other input for its gradient; after the pass the Mul reads cos from the rotary module, through an
    Identity right after the rotary's bridge (ORT then sees a value of the Mul's own, with no other gradient writer)."""
    graph = rotary_and_layer()
    assert bypass_gradient_free_outputs(graph) == ["cos_l"]
    assert reader_of(graph, "mul") == ["hidden_l", "cos/gradient_free"]
    names = [node.name for node in graph.node]
    assert reader_of(graph, "cos/gradient_free") == ["cos"]
    assert names.index("cos/gradient_free") == names.index("rotary_post") + 1


def test_a_module_whose_forward_reads_only_what_has_no_gradient_keeps_carrying_it() -> None:
    """The rotary module computes cos from the positions alone: bypassed, its release could run before its gather,
    so its PreForwardBridge keeps carrying the positions; a bridge with nothing reachable (its post) is left."""
    graph = rotary_and_layer()
    bypass_gradient_free_outputs(graph)
    assert reader_of(graph, "cast") == ["positions_r"]  # read from the rotary bridge, after its gather
    assert reader_of(graph, "layer_post") == ["rotated"]
    assert reader_of(graph, "layer_pre") == ["hidden", "cos"]  # still handed cos, whose copy nothing reads


def test_nothing_reachable_nothing_bypassed() -> None:
    graph = rotary_and_layer()
    del graph.input[0]
    graph.input.insert(0, helper.make_tensor_value_info("hidden", INT64, [2, 2]))
    assert bypass_gradient_free_outputs(graph) == []


ROTARY_KEPT = Path(__file__).parent / "scripts" / "rotary_kept_zero3.py"


@pytest.mark.extended
def test_a_bypassed_value_a_concat_reads_gets_one_gradient_writer(tmp_path: Path) -> None:
    """Inkling 2 hands its layers empty block states beside the hidden states and concatenates them there; ORT's
    Concat gradient writes a gradient for every input, so read directly the empty states got two writers of theirs
    and ORT refused the graph ("Duplicate definition"). The sweep trains it in ORT (fallback off) as in PyTorch."""
    command = [sys.executable, "-m", "ort_zero.tools.causal_lm_sweep", "--types", "inkling2_text", "--steps", "2"]
    subprocess.run([*command, "--out", str(tmp_path)], capture_output=True, text=True, timeout=600, check=True)
    result = json.loads((tmp_path / "results.jsonl").read_text().splitlines()[-1])
    assert result["status"] == "trains", result.get("error", result)
    assert result["max_loss_diff"] <= 1e-5, result


def test_a_zero3_llama_keeps_no_query_or_key_for_the_rotary_embedding() -> None:
    """A ZeRO-3 LLaMA in ORT (one rank, fallback off): with cos and sin riding each layer's bridge, ORT kept four
    [batch, heads, seq, head size] tensors per layer for their gradients (8 in 2 layers); none now."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(ROTARY_KEPT)], env=env, capture_output=True, text=True, timeout=300, check=True
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["ort_ran"], result
    assert math.isfinite(result["loss"]), result
    assert result["kept"] == [], result
