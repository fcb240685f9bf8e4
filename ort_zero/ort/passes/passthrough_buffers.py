"""Training-graph pass: ORT's buffer plan alone owns the memory of ort_zero's pass-through PythonOps' outputs.

ORT (onnxruntime 1.19.2 allocation planner) releases a value only through the buffer it is planned in: a value
planned in another value's buffer (an alias: a Reshape's output, a PythonOp output its alias map declares a view of
an input) is never released itself; the buffer is, after the last reader of any value in it. A PythonOp returns its
outputs as tensors ORT keeps in its run state; one that owned its memory, as an autograd Function's view of its
input does, kept that memory alive until the run ended, after the backward: every activation that crossed a module
boundary. Measured: ORT-ZeRO3 with layer-wise recompute held 142 MiB per rank from forward to backward, native
ZeRO-3 with checkpointing 11; with this pass 12.

So the pass fixes, per PythonOp, where ORT plans its outputs and gradients, and tells the Function (in the graph's
`hooks.passthrough.BufferPlans`), which then returns views that own nothing (`hooks.passthrough.borrowed`) where
ORT plans an alias and copies where ORT plans a buffer of their own (which also keeps ORT's PythonOp kernel from
copying them itself, announced on stdout):
- forward: as each Function's alias map says, except for the PythonOps that feed the YieldOp (ORT plans no alias
  for a node whose first consumer is the YieldOp); those lose their map and return copies, one buffer per model
  output. Measured before the rule: with ORT's memory reuse on, the final LayerNorm's bias gradient was summed from
  a buffer the backward had already overwritten.
- backward: each passed-through gradient is planned in its output gradient's buffer where that gradient exists in
  every gradient node of the same PythonOp (Function and integer arguments: its Python call cannot tell the nodes
  apart) and is not a graph output; other gradients are copies.
A model that falls back to PyTorch forgets its graph's plans (`ort.ortmodule.graph_execution_manager.loud_fallback`);
other models keep theirs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import onnx

from ...hooks import passthrough
from ...hooks.passthrough import PythonOpKey
from ...hooks.statistics import EndStep, RecordStatistics
from ...python_op import function_name, function_name_of, ints_attribute
from ...zero3.bridges import PostForwardBridge, PreForwardBridge, StepStartBridge
from ..graph.edit import set_ints_attribute
from .base import GraphPass, TrainingGraph

PASS_THROUGH_FUNCTIONS = frozenset(
    function_name(function)
    for function in (StepStartBridge, PreForwardBridge, PostForwardBridge, RecordStatistics, EndStep)
)
"""The Functions that return their inputs through `hooks.passthrough` (the exporter traces them into the forward)."""
_REUSE = "tensor_reuse_map"
logger = logging.getLogger(__name__)


@dataclass
class BufferPlan:
    """What the pass did, for the log: pass-through PythonOps seen, those returning copies, gradients borrowed."""

    python_ops: int = 0
    copied_outputs: list[str] = field(default_factory=list)
    borrowed_grads: int = 0

    def log(self) -> None:
        if self.python_ops:
            logger.info(
                "ort_zero: %d pass-through PythonOps return views of ORT's buffers (and %d gradients); copies: %s",
                self.python_ops,
                self.borrowed_grads,
                ", ".join(self.copied_outputs) or "none",
            )


def run(training: TrainingGraph) -> BufferPlan:
    """The pass's entry (see `plan_passthrough_buffers`)."""
    return plan_passthrough_buffers(training.graph, training.buffer_plans)


# Last: it plans the PythonOps every earlier pass inserted.
PASS = GraphPass("passthrough_buffers", run, needs=frozenset({"backward_regathers", "recomputed_regions"}))


def plan_passthrough_buffers(graph: onnx.GraphProto, plans: passthrough.BufferPlans) -> BufferPlan:
    """Fix how ort_zero's PythonOps in `graph` return their tensors, in `plans` (see the module docstring)."""
    forward = [node for node in graph.node if function_name_of(node) in PASS_THROUGH_FUNCTIONS]
    by_ctx = {node.output[0]: node for node in forward}
    gradient = [
        node for node in graph.node if node.op_type == "PythonOpGrad" and node.input and node.input[0] in by_ctx
    ]
    plan = BufferPlan(python_ops=len(forward))

    copied = {_key(node) for node in _feeding_yield(graph, forward)}
    for node in forward:
        if _key(node) in copied:
            set_ints_attribute(node, _REUSE, [-1] * len(ints_attribute(node, _REUSE)))
            plan.copied_outputs.append(node.name)

    graph_outputs = {value.name for value in graph.output}
    borrowable: dict[PythonOpKey, set[int]] = {_key(node): set() for node in forward}
    has_gradient: set[PythonOpKey] = set()
    planned = [(node, _key(by_ctx[node.input[0]]), ints_attribute(by_ctx[node.input[0]], _REUSE)) for node in gradient]
    for node, key, forward_map in planned:
        here = {
            tensor_input
            for output, tensor_input in enumerate(forward_map)
            if output > 0
            and 0 <= tensor_input < len(node.output)
            and output < len(node.input)
            and node.input[output]
            and node.output[tensor_input]
            and node.output[tensor_input] not in graph_outputs
        }
        borrowable[key] = borrowable[key] & here if key in has_gradient else here
        has_gradient.add(key)
    for node, key, forward_map in planned:
        # Forward output o (0 is ctx) is a view of tensor input forward_map[o]; its gradient is this node's input
        # o, and this node's output t is tensor input t's gradient.
        backward_map = [-1] * len(node.output)
        for output, tensor_input in enumerate(forward_map):
            if output > 0 and tensor_input in borrowable[key]:
                backward_map[tensor_input] = output
        set_ints_attribute(node, _REUSE, backward_map)
        plan.borrowed_grads += sum(1 for index in backward_map if index >= 0)
    for key, tensor_inputs in borrowable.items():
        plans.plan(*key, copied=key in copied, borrowed_grads=frozenset(tensor_inputs))
    return plan


def _key(node: onnx.NodeProto) -> PythonOpKey:
    return function_name_of(node) or "", tuple(ints_attribute(node, "input_int_scalars"))


def _feeding_yield(graph: onnx.GraphProto, nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """The nodes among `nodes` whose outputs reach the YieldOp, directly or through Identity nodes."""
    producer = {value: node for node in graph.node for value in node.output}
    candidates = {id(node) for node in nodes}
    found: dict[str, onnx.NodeProto] = {}
    for value in (value for node in graph.node if node.op_type == "YieldOp" for value in node.input):
        node = producer.get(value)
        while node is not None and node.op_type == "Identity":
            node = producer.get(node.input[0])
        if node is not None and id(node) in candidates:
            found[node.name] = node
    return list(found.values())
