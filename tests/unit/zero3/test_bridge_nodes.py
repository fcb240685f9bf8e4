"""A bridge's PythonOp layout is read and built in one place (`ort_zero.zero3.bridge_nodes`): the node a bridge's
call makes reads back as that call, the nodes the passes build read back as what they were built from, and no pass
decodes a bridge's scalars or outputs by position."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import torch
from onnx import TensorProto, helper

import ort_zero
from ort_zero.python_op import first_output, int_scalars, ints_attribute, make_python_op
from ort_zero.zero3.bridge_nodes import BridgeNode
from ort_zero.zero3.bridges import PostForwardBridge, PreForwardBridge
from ort_zero.zero3.ort_bridges import BackwardParamsBridge, RecomputeStartBridge

FLOAT, BF16 = TensorProto.FLOAT, TensorProto.BFLOAT16
PASSES = Path(ort_zero.__file__).parent / "ort" / "passes"


def pre_forward_call() -> BridgeNode:
    """A module with inputs x (rank 3) and mask (rank 2) and one partitioned parameter: PreForwardBridge(key 7,
    input_count 2, x, mask, placeholder) as the exporter writes it."""
    node = make_python_op(
        "ort_zero.zero3.bridges.PreForwardBridge",
        "pre",
        int_scalars=[7, 2],
        inputs=[("x", 3, BF16), ("mask", 2, FLOAT), ("placeholder", 1, FLOAT)],
        outputs=[("x_out", 3, BF16), ("mask_out", 2, FLOAT), ("weight_full", 2, BF16)],
    )
    bridge = BridgeNode.of(node, PreForwardBridge)
    assert bridge is not None
    return bridge


def test_a_pre_forward_call_reads_back_as_the_call() -> None:
    bridge = pre_forward_call()
    assert (bridge.key, bridge.input_count, bridge.context) == (7, 2, "pre_ctx")
    assert bridge.passed_outputs == ["x_out", "mask_out"]
    assert bridge.param_outputs == ["weight_full"]
    assert [bridge.passed_input(v) for v in ("x_out", "mask_out", "weight_full")] == ["x", "mask", None]
    assert [bridge.param_index(v) for v in ("x_out", "weight_full")] == [None, 0]
    assert bridge.output_for_input(2) == "weight_full"  # a placeholder's position is its parameter's
    assert bridge.passed_inputs_typed() == [("x", 3, BF16), ("mask", 2, FLOAT)]
    assert BridgeNode.of(bridge.node, PostForwardBridge) is None


def test_a_post_forward_call_passes_every_input_through() -> None:
    node = make_python_op(
        "ort_zero.zero3.bridges.PostForwardBridge", "post", [7], [("h", 3, BF16)], [("h_out", 3, BF16)]
    )
    bridge = BridgeNode.of(node, PostForwardBridge)
    assert bridge is not None
    assert (bridge.key, bridge.input_count, bridge.passed_input("h_out"), bridge.param_outputs) == (7, 1, "h", [])


def test_a_recompute_start_reads_back_and_takes_one_more_input() -> None:
    pre = pre_forward_call()
    start = BridgeNode.recompute_start("start", 7, after=("anchor_out", 3, BF16), inputs=pre.passed_inputs_typed())
    assert BridgeNode.of(start.node, RecomputeStartBridge) is not None
    assert start.node.input[:] == ["anchor_out", "x", "mask"]
    assert start.outputs == ["start_0", "start_1"]

    added = start.pass_another(("rotary_cos", 2, BF16))
    assert added == "start_2"
    assert start.node.input[-1] == "rotary_cos" and start.outputs[-1] == added
    assert ints_attribute(start.node, "input_tensor_types") == [BF16, BF16, FLOAT, BF16]
    assert ints_attribute(start.node, "output_tensor_ranks") == [3, 2, 2]
    convention = next(a.s for a in start.node.attribute if a.name == "input_convention")
    assert convention == b"cdddd"


def test_a_params_bridge_carries_the_ds_ids_its_forward_takes() -> None:
    params = [
        SimpleNamespace(ds_id=11, ds_shape=torch.Size([4, 8]), dtype=torch.bfloat16),
        SimpleNamespace(ds_id=12, ds_shape=torch.Size([8]), dtype=torch.bfloat16),
    ]
    ranks_and_types = {"output_tensor_ranks": [3, 3], "output_tensor_types": [BF16, BF16]}
    # a gradient node whose first output ORT left out
    grad = helper.make_node("PythonOpGrad", ["ctx", "d_h"], ["", "d_x"], "grad", **ranks_and_types)
    bridge = BridgeNode.params_bridge(BackwardParamsBridge, "regather", 7, params, after=first_output(grad))
    assert bridge.key == 7 and int_scalars(bridge.node)[1:] == [11, 12]
    assert bridge.node.input[:] == ["d_x"]  # the gradient node's first output that exists
    assert bridge.outputs == ["regather_0", "regather_1"]
    assert ints_attribute(bridge.node, "output_tensor_ranks") == [2, 1]


def test_no_pass_decodes_a_bridge_by_position() -> None:
    """A bridge's scalars are read by name (`BridgeNode.scalar`), its outputs through `BridgeNode`."""
    positional = re.compile(r'"input_int_scalars"|int_scalars\(|\.output\[1 \+|\.output\[slot - ')
    found = [
        f"{path.name}:{number}: {line.strip()}"
        for path in sorted(PASSES.glob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if positional.search(line)
    ]
    assert not found, found
