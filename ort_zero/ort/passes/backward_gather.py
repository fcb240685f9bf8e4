"""Training-graph pass: a module's backward reads its parameters gathered again for it, never the forward's copy.

ORT's gradient graph reads the weights the forward used (a MatMul's input gradient needs its weight), so ORT would
keep every parameter gathered in the forward alive until the backward: the whole model's memory on every rank.
Native ZeRO-3 releases a module's parameters after its forward and gathers them again before its backward (in
ort_zero: the PostForwardBridge's backward). This pass gives the graph that second gather:

- after each PostForwardBridge gradient node (an *anchor*: where DeepSpeed gathers for a module's backward) whose
  module's parameters the backward reads, a `BackwardParamsBridge` PythonOp outputs the re-gathered parameters;
- every backward read of a forward-gathered parameter, or of a view or cast of one (re-done in the backward from
  the re-gathered parameter, as DeepSpeed DeepCompile's partitioner recomputes them instead of saving them), is
  rewired to the re-gather of the nearest anchor it depends on among the modules that gather that parameter;
- what becomes unused is removed. A read that no anchor precedes keeps the forward copy and is reported.

It runs on the complete forward+backward graph, through ORT's graph-optimizer registry, before the session exists.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from dataclasses import dataclass, field

import onnx
import torch
from onnx import helper

from ...foreign import deepspeed as ds_internals
from ...python_op import first_output, gradient_context
from ...zero3 import state as zero3_state
from ...zero3.bridge_nodes import BridgeNode
from ...zero3.bridges import PostForwardBridge, PreForwardBridge
from ...zero3.ort_bridges import BackwardParamsBridge
from ..graph.edit import is_zero3_graph, register_function
from ..graph.training_graph import SHAPE_OPS, VIEW_OPS, TrainingGraphView, bits
from .base import GraphPass, TrainingGraph
from .contract import Edit

logger = logging.getLogger(__name__)


@dataclass
class BackwardGatherReport:
    """What the pass did to one training graph."""

    regathers: int = 0  # BackwardParamsBridge nodes inserted
    rewired_reads: int = 0  # backward inputs now reading a re-gathered parameter (or a view re-done from one)
    kept: list[str] = field(default_factory=list)  # "node <- value": backward reads still of forward copies
    registered: list[str] = field(default_factory=list)  # "param ds_id -> module": `external`, said
    # parameters the backward reads outside the modules that own them, each with the module whose re-gather serves
    # it: DeepSpeed's external parameters of that module, registered before the session runs (the training manager)
    external: list[tuple[torch.nn.Module, torch.nn.Parameter]] = field(default_factory=list)

    def log(self) -> None:
        if self.regathers:
            logger.info(
                "ort_zero: backward re-gathers for %d modules (%d reads rewired; external parameters to register: %s)",
                self.regathers,
                self.rewired_reads,
                ", ".join(self.registered) or "none",
            )


def run(training: TrainingGraph) -> BackwardGatherReport:
    """The pass's entry (see `regather_for_backward`); the external parameters it found go into the graph's plan."""
    report = regather_for_backward(training.graph)
    training.external_params += report.external
    return report


PASS = GraphPass(
    "backward_gather",
    run,
    edits=frozenset({Edit.INSERT, Edit.REWIRE, Edit.REWRITE, Edit.REMOVE}),
    provides=frozenset({"backward_regathers"}),
)


def regather_for_backward(graph: onnx.GraphProto) -> BackwardGatherReport:
    """Apply the pass in place to a training graph of ort_zero's bridges; a graph without them is left alone."""
    report = BackwardGatherReport()
    if not is_zero3_graph(graph):
        return report
    view = TrainingGraphView(graph)
    origins = _forward_gathered(view)
    _constant_shapes(view, origins)
    anchors = dict(_anchors(view))  # anchor node index -> module key
    ancestry = view.anchor_ancestry(list(anchors))
    gathers = {
        key: {id(p) for p in ds_internals.fetched_params(zero3_state.lookup(key).module)} for key in anchors.values()
    }

    # Which anchor's re-gather serves each backward read: the nearest one among modules that gather the parameter.
    reads: list[tuple[onnx.NodeProto, int, str, int]] = []  # (reader, input slot, value, anchor)
    for reader in view.backward:
        node = view.nodes[reader]
        for slot, value in enumerate(node.input):
            origin = origins.get(value)
            if origin is None or _is_redoable(node, view, reader):
                continue
            preceding = sorted(bits(ancestry[reader]), key=view.position.__getitem__)
            gathering = [a for a in preceding if id(origin.param) in gathers[anchors[a]]]
            if not gathering and preceding:
                # Read outside every module that owns it (e.g. a parent reading a child's weight). DeepSpeed
                # registers such a parameter with the running module at its first eager forward, which the
                # ORT graph hides from it: it is to be registered with the nearest module whose backward comes first.
                module = zero3_state.lookup(anchors[preceding[-1]]).module
                report.external.append((module, origin.param))
                gathers[anchors[preceding[-1]]].add(id(origin.param))
                report.registered.append(f"{origin.param.ds_id} -> {type(module).__name__} (ds_id {module.ds_id})")
                gathering = [preceding[-1]]
            if not gathering:
                report.kept.append(f"{node.name or node.op_type} <- {value}")
                continue
            reads.append((node, slot, value, gathering[-1]))

    needed: dict[int, dict[int, torch.nn.Parameter]] = defaultdict(dict)
    for _, _, value, anchor in reads:
        needed[anchor][id(origins[value].param)] = origins[value].param
    regathers = {
        anchor: _Regather(view, anchor, anchors[anchor], list(params.values())) for anchor, params in needed.items()
    }
    new_nodes = [regather.node for regather in regathers.values()]
    for node, slot, value, anchor in reads:
        node.input[slot] = regathers[anchor].value_for(value, origins, new_nodes)
    report.regathers, report.rewired_reads = len(regathers), len(reads)
    if regathers:
        view.rebuild(new_nodes)
        register_function(BackwardParamsBridge)
    if report.kept:
        logger.warning(
            "ort_zero: %d backward reads of ZeRO-3 parameters keep the forward's gathered copies alive until the "
            "backward (no module's backward precedes them): %s. Register each parameter with the module that "
            "uses it: deepspeed.zero.register_external_parameter(module, param)",
            len(report.kept),
            ", ".join(report.kept[:5]),
        )
    return report


def forward_gathered_reads(graph: onnx.GraphProto) -> list[str]:
    """Backward reads of forward-gathered parameters or their views ("node <- value"): each keeps a gathered copy
    alive from the forward to the backward. Empty after `regather_for_backward`, unless it reported reads it kept."""
    if not is_zero3_graph(graph):
        return []
    view = TrainingGraphView(graph)
    origins = _forward_gathered(view)
    return [
        f"{view.nodes[i].name or view.nodes[i].op_type} <- {value}"
        for i in view.not_forward
        for value in view.nodes[i].input
        if value in origins and not _is_redoable(view.nodes[i], view, i)
    ]


@dataclass(frozen=True, eq=False)
class _Origin:
    """A value that is a forward-gathered parameter (`node` None) or a view of one made by `node`."""

    param: torch.nn.Parameter
    node: onnx.NodeProto | None = None


def _forward_gathered(view: TrainingGraphView) -> dict[str, _Origin]:
    """Values that are forward-gathered parameters (PreForwardBridge outputs), views/casts of them, and (outside
    the forward) their shapes."""
    origins: dict[str, _Origin] = {}
    for i in view.order:
        node = view.nodes[i]
        if (bridge := BridgeNode.of(node, PreForwardBridge)) is not None and i in view.forward:
            params = zero3_state.lookup(bridge.key).bridged_params()
            for param, value in zip(params, bridge.param_outputs, strict=True):
                origins[value] = _Origin(param)
        elif (
            node.input
            and node.input[0] in origins
            and (node.op_type in VIEW_OPS or _is_redoable(node, view, i))
            and node.domain in ("", "ai.onnx")
        ):
            origins[node.output[0]] = _Origin(origins[node.input[0]].param, node)
    return origins


def _constant_shapes(view: TrainingGraphView, origins: dict[str, _Origin]) -> None:
    """Outside the forward, the shape of a gathered parameter is its `ds_shape`: a constant, not a read of it."""
    for i in view.not_forward:
        node = view.nodes[i]
        origin = origins.get(node.input[0]) if node.input else None
        if node.op_type not in SHAPE_OPS or origin is None or origin.node is not None:
            continue
        shape = list(origin.param.ds_shape)
        if node.op_type == "Size":
            constant = helper.make_tensor("size", onnx.TensorProto.INT64, [], [math.prod(shape)])
        else:
            attributes = {a.name: a.i for a in node.attribute}
            shape = shape[attributes.get("start", 0) : attributes.get("end", len(shape))]
            constant = helper.make_tensor("shape", onnx.TensorProto.INT64, [len(shape)], shape)
        del origins[node.output[0]]
        node.op_type, node.domain = "Constant", ""
        del node.input[:]
        del node.attribute[:]
        node.attribute.append(helper.make_attribute("value", constant))


def _is_redoable(node: onnx.NodeProto, view: TrainingGraphView, index: int) -> bool:
    """A view or shape of a parameter outside the forward: re-done wherever the backward reads it, not rewired."""
    return index not in view.forward and node.op_type in VIEW_OPS | SHAPE_OPS and node.domain in ("", "ai.onnx")


def _anchors(view: TrainingGraphView) -> list[tuple[int, int]]:
    """(node index, module key) of every PostForwardBridge gradient node."""
    bridges = (BridgeNode.of(node, PostForwardBridge) for node in view.nodes)
    forward_key = {bridge.context: bridge.key for bridge in bridges if bridge is not None}
    return [
        (i, forward_key[context])
        for i, node in enumerate(view.nodes)
        if (context := gradient_context(node)) is not None and context in forward_key
    ]


class _Regather:
    """One BackwardParamsBridge after one anchor, and the views re-done from its outputs."""

    def __init__(self, view: TrainingGraphView, anchor: int, key: int, params: list[torch.nn.Parameter]) -> None:
        self.name = f"ort_zero_backward_params_{anchor}"
        self.bridge = BridgeNode.params_bridge(
            BackwardParamsBridge, self.name, key, params, after=first_output(view.nodes[anchor])
        )
        self.node = self.bridge.node
        self.index = {id(p): j for j, p in enumerate(params)}
        self.redone: dict[str, str] = {}

    def value_for(self, value: str, origins: dict[str, _Origin], new_nodes: list[onnx.NodeProto]) -> str:
        """The name of `value` computed from this re-gather's output instead of the forward copy."""
        if value in self.redone:
            return self.redone[value]
        origin = origins[value]
        if origin.node is None:
            name = self.bridge.outputs[self.index[id(origin.param)]]
        else:
            copy = onnx.NodeProto()
            copy.CopyFrom(origin.node)
            copy.name = f"{origin.node.name or origin.node.op_type}_{self.name}"
            copy.input[0] = self.value_for(origin.node.input[0], origins, new_nodes)
            name = f"{origin.node.output[0]}_{self.name}"
            copy.output[0] = name
            new_nodes.append(copy)
        self.redone[value] = name
        return name
