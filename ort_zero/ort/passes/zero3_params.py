"""Post-export pass: ZeRO-3 parameters (persistent ones too) leave the graph inputs; bridges provide them.

Exported as they are, partitioned parameters are graph inputs that ORTModule would feed with their (0)-sized local
data. After this pass:
- each partitioned parameter `P` is read, by every consumer, from the full-sized output of the first pre-forward
  bridge that gathers it (later bridges of the same parameter keep gathering and releasing, but their copies go
  unused), so ORT hands `P`'s whole gradient to that one bridge, whose backward hands it to DeepSpeed exactly once
  (`ModuleState.gradients_arrived`: `grad_handoff`, while `P` is still gathered);
- the bridges' parameter inputs are one-element placeholders from a `ParamPull` PythonOp fed by a single trigger
  graph input that requires grad, which puts the bridges on ORT's gradient path;
- `P` is no longer a graph input.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import onnx
import torch
from onnx import helper

from ...python_op import function_name
from ...zero3.bridge_nodes import BridgeNode
from ...zero3.bridges import PreForwardBridge
from ..export.context import zero3_named_params
from ..graph.edit import make_trigger_python_op, register_function, replace_input_uses, retype_python_op_input
from ..step.functions import ParamPull
from .base import ExportedGraph, GraphPass
from .contract import Edit

logger = logging.getLogger(__name__)

# ORTModule's own name for the weight-pull trigger: with ORTMODULE_ENABLE_ZERO_STAGE3=1 it feeds this input itself.
TRIGGER_NAME = "pull_weight_trigger"


class ExportError(RuntimeError):
    """The exported graph uses a partitioned parameter in a way the rewrite cannot serve."""


@dataclass
class BridgedParams:
    """The partitioned parameters that left the graph inputs."""

    removed: list[str]

    def log(self) -> None:
        if self.removed:
            logger.debug("ort_zero: %d partitioned parameters now come from their bridges", len(self.removed))


def run(exported: ExportedGraph) -> BridgedParams:
    """The pass's entry: rewrite the exported graph of a ZeRO-3 module (any other is left alone)."""
    named = dict(exported.module.named_parameters())
    removed = rewrite_partitioned_params(exported.model, zero3_named_params(exported.module), list(named))
    if removed:
        register_function(ParamPull)
    exported.removed_inputs += removed
    return BridgedParams(removed)


PASS = GraphPass(
    "zero3_params",
    run,
    edits=frozenset({Edit.INSERT, Edit.REWIRE, Edit.REWRITE}),
    provides=frozenset({"zero3_params_from_bridges"}),
)


def rewrite_partitioned_params(
    model: onnx.ModelProto, partitioned: dict[str, torch.nn.Parameter], param_names: list[str]
) -> list[str]:
    """Apply the pass in place; return the names of the parameters removed from the graph inputs."""
    graph = model.graph
    present = [i.name for i in graph.input if i.name in partitioned]
    if not present:
        return []
    placeholders = {name: f"ort_zero_placeholder_{index}" for index, name in enumerate(present)}
    # Who reads each parameter, found in one walk over the graph (a walk per parameter took 0.5 s of the first step
    # at 162M parameters); the loop below rewires bridge inputs, so it checks that a reader still reads the name.
    readers: dict[str, dict[int, onnx.NodeProto]] = {name: {} for name in present}
    bridge_reads: dict[str, list[tuple[int, BridgeNode, int]]] = {name: [] for name in present}
    for position, node in enumerate(graph.node):
        bridge = BridgeNode.of(node, PreForwardBridge)
        for index, input_name in enumerate(node.input):
            if input_name in readers:
                readers[input_name][position] = node
                if bridge is not None:
                    bridge_reads[input_name].append((position, bridge, index))

    for name in present:
        users = bridge_reads[name]
        if not users:
            raise ExportError(
                f"partitioned parameter '{name}' is used by the exported graph but no module gathers it: the module "
                "that owns it never runs in this forward. Register it with the module that uses it: "
                "deepspeed.zero.register_external_parameter(module, param)"
            )
        first_position, first_bridge, first_index = users[0]
        full = first_bridge.output_for_input(first_index)
        for _, bridge, index in users[1:]:
            replace_input_uses(graph.node, bridge.output_for_input(index), full)
        for _, bridge, index in users:
            bridge.node.input[index] = placeholders[name]
            retype_python_op_input(bridge.node, index, 1, onnx.TensorProto.FLOAT)
        raw_users = [(position, node) for position, node in sorted(readers[name].items()) if name in node.input]
        early = [node.name for position, node in raw_users if position < first_position]
        if early:
            raise ExportError(
                f"partitioned parameter '{name}' is used by {early} before the first module that gathers it runs; "
                "move the use into a module or register the parameter with an earlier module "
                "(deepspeed.zero.register_external_parameter)"
            )
        replace_input_uses([node for _, node in raw_users], name, full)
        if any(output.name == name for output in graph.output):
            raise ExportError(f"partitioned parameter '{name}' is a model output; return a copy of it instead")

    _remove_inputs(graph, set(present))
    first_param = next((i for i, g in enumerate(graph.input) if g.name in set(param_names)), len(graph.input))
    graph.input.insert(first_param, helper.make_tensor_value_info(TRIGGER_NAME, onnx.TensorProto.FLOAT, [1]))
    pull = make_trigger_python_op(
        function_name(ParamPull), TRIGGER_NAME, [placeholders[name] for name in present], "ort_zero_param_pull"
    )
    graph.node.insert(0, pull)
    return present


def _remove_inputs(graph: onnx.GraphProto, names: set[str]) -> None:
    for graph_input in [i for i in graph.input if i.name in names]:
        graph.input.remove(graph_input)
