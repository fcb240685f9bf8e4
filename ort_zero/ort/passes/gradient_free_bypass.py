"""Export pass: a module-boundary bridge's output that no gradient can reach is read from the bridge's input.

A PreForwardBridge or PostForwardBridge passes all of its module's tensors through. ORT's gradient builder takes
every output of a PythonOp as differentiable once one of its inputs is, so a tensor without a gradient that rides
a bridge beside one with a gradient gets a gradient computed for nobody, and ORT keeps what that gradient needs.
LLaMA's rotary cos and sin ride every decoder layer's bridge with the hidden states: each layer then kept its
query and key and their rotated halves for cos's and sin's gradients, four [heads, seq, head size] tensors. The
export cannot tell by `requires_grad` (ORTModule traces under `torch.no_grad()`), so this pass follows the graph:
an output of a bridge is reachable from a gradient when its own input is; after it, readers of the others read
the input. Reachability is over-approximated (every floating-point graph input, ZeRO-3's trigger among them; the
floating-point outputs, or those of unknown type, of a node any of whose inputs is reachable, of any other PythonOp
and of any node with a subgraph), so nothing that needs a gradient is bypassed; integer values (positions, shapes)
carry none, as in ORT's own gradient builder. A bridge none of whose outputs is reachable keeps them all (its gather
or release then still has readers), and the StepStartBridge is never bypassed (every gather of a step follows it).
The readers read the input through an Identity of their own: some of ORT's gradient builders (Concat's) write a
gradient for every input, needed or not, and a value that gained such a reader beside one it had would get two
writers of its gradient (Inkling 2's empty block states: "Duplicate definition" in ORT's gradient graph build).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import onnx

from ...python_op import function_name_of
from ...zero3.bridge_nodes import BridgeNode
from ...zero3.bridges import PostForwardBridge, PreForwardBridge
from ..graph.types import element_types
from .base import ExportedGraph, GraphPass
from .contract import Edit

logger = logging.getLogger(__name__)

_FLOATS = frozenset(
    {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16}
)


@dataclass
class BypassedOutputs:
    """Bridge outputs whose readers now read the bridge's input."""

    bypassed: list[str]

    def log(self) -> None:
        if self.bypassed:
            logger.debug(
                "ort_zero: %d bridge outputs no gradient reaches pass around their bridges", len(self.bypassed)
            )


def reachable_from_gradients(graph: onnx.GraphProto) -> set[str]:
    """The values some gradient may flow to (an over-approximation); a bridge's output i is one when its input i is."""
    types = element_types(graph)
    reached = {value.name for value in graph.input if value.type.tensor_type.elem_type in _FLOATS}
    for node in graph.node:  # an exported graph lists its nodes in topological order
        if (bridge := _module_bridge(node)) is not None:
            passed = [index for index, value in enumerate(node.input) if value in reached]
            reached.update(bridge.output_for_input(index) for index in passed)
            if passed:
                reached.add(bridge.context)
        elif function_name_of(node) is not None or _has_subgraph(node) or any(value in reached for value in node.input):
            reached.update(out for out in node.output if out and types.get(out, onnx.TensorProto.FLOAT) in _FLOATS)
    return reached


def _module_bridge(node: onnx.NodeProto) -> BridgeNode | None:
    """`node` as a module's Pre- or PostForwardBridge."""
    return BridgeNode.of(node, PreForwardBridge) or BridgeNode.of(node, PostForwardBridge)


def _has_subgraph(node: onnx.NodeProto) -> bool:
    return any(
        attribute.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for attribute in node.attribute
    )


def bypass_gradient_free_outputs(graph: onnx.GraphProto) -> list[str]:
    """Apply the pass in place; return the bypassed outputs.

    A module's release must still follow its gather: where its forward read only bypassed inputs (the rotary
    embedding computes cos and sin from the positions alone), its PreForwardBridge keeps carrying them."""
    reached = reachable_from_gradients(graph)
    model_outputs = {value.name for value in graph.output}
    nodes = list(graph.node)
    plans = {}
    for position, node in enumerate(nodes):
        if (bridge := _module_bridge(node)) is None:
            continue
        carried = bridge.tensor_pairs()
        if any(value in reached for value, _ in carried):
            plans[position] = [(v, out) for v, out in carried if v not in reached and out not in model_outputs]
    # the innermost first: an outer bridge then finds the readers an inner one handed its outputs
    rewired = {position: _rewire(nodes, plan) for position, plan in sorted(plans.items(), reverse=True) if plan}
    for pre, post in _module_calls(nodes):
        if pre in rewired and not _depends_on(nodes, post, pre):
            for reader, slot, output in rewired.pop(pre):
                reader.input[slot] = output
    changes = [change for plan in rewired.values() for change in plan]
    _read_through_identities(graph, changes)
    return list(dict.fromkeys(output for _, _, output in changes))  # an output with several readers, once


def _read_through_identities(graph: onnx.GraphProto, changes: list[tuple[onnx.NodeProto, int, str]]) -> None:
    """The rewired readers of each value read it through one Identity, placed right after the value's maker."""
    copies: dict[str, str] = {}
    for reader, slot, _ in changes:
        value = reader.input[slot]
        if value not in copies:
            copies[value] = f"{value}/gradient_free"
        reader.input[slot] = copies[value]
    makers = {out: position for position, node in enumerate(graph.node) for out in node.output if out}
    for value, copy in sorted(copies.items(), key=lambda item: -makers.get(item[0], -1)):
        identity = onnx.helper.make_node("Identity", [value], [copy], name=copy)
        graph.node.insert(makers.get(value, -1) + 1, identity)


def _rewire(nodes: list[onnx.NodeProto], plan: list[tuple[str, str]]) -> list[tuple[onnx.NodeProto, int, str]]:
    """Readers of each planned output read its input instead; the changes, as (reader, slot, former value)."""
    bypass = {output: value for value, output in plan}
    changes = []
    for reader in nodes:
        for slot, name in enumerate(reader.input):
            if name in bypass:
                reader.input[slot] = bypass[name]
                changes.append((reader, slot, name))
    return changes


def _module_calls(nodes: list[onnx.NodeProto]) -> list[tuple[int, int]]:
    """(PreForwardBridge, PostForwardBridge) positions of each module call, paired innermost first by key."""
    open_calls: dict[int, list[int]] = {}
    calls = []
    for position, node in enumerate(nodes):
        if (pre := BridgeNode.of(node, PreForwardBridge)) is not None:
            open_calls.setdefault(pre.key, []).append(position)
        elif (post := BridgeNode.of(node, PostForwardBridge)) is not None and (opened := open_calls.get(post.key)):
            calls.append((opened.pop(), position))
    return calls


def _depends_on(nodes: list[onnx.NodeProto], later: int, earlier: int) -> bool:
    """Whether node `later` reads, through nodes listed between the two, a value node `earlier` made."""
    made = {out for out in nodes[earlier].output if out}
    for position in range(earlier + 1, later + 1):
        if any(value in made for value in nodes[position].input):
            if position == later:
                return True
            made.update(out for out in nodes[position].output if out)
    return False


def run(exported: ExportedGraph) -> BypassedOutputs:
    return BypassedOutputs(bypass_gradient_free_outputs(exported.model.graph))


PASS = GraphPass(
    "gradient_free_bypass",
    run,
    edits=frozenset({Edit.INSERT, Edit.REWIRE}),
    needs=frozenset({"zero3_params_from_bridges"}),
)
