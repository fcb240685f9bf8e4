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
- forward: as each Function's alias map says, except for the outputs the YieldOp reads (ORT plans no alias for a
  value whose first consumer is the YieldOp): those are copies (`yield_from_makers` leaves it few: it has the
  YieldOp read the others from the kernels that made them). Measured before the rule: with ORT's memory reuse
  on, the final LayerNorm's bias gradient was summed from a buffer the backward had already overwritten.
- backward: each passed-through gradient is planned in its output gradient's buffer where that gradient exists in
  every gradient node of the same PythonOp (Function and integer arguments: its Python call cannot tell the nodes
  apart), is not a graph output and is not a model output's; other gradients are copies.
A model that falls back to PyTorch forgets its graph's plans (`ort.ortmodule.graph_execution_manager.loud_fallback`);
other models keep theirs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import onnx

from ...hooks import passthrough
from ...hooks.passthrough import PythonOpKey
from ...python_op import context_of, gradient_context, ints_attribute, set_ints_attribute
from ..graph.pass_through import REUSE, is_pass_through, python_op_key
from .base import GraphPass, TrainingGraph, YieldFeed
from .contract import Edit

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
    return plan_passthrough_buffers(training.graph, training.buffer_plans, training.yield_feeds)


# Last: it plans the PythonOps every earlier pass inserted.
PASS = GraphPass(
    "passthrough_buffers",
    run,
    edits=frozenset({Edit.REWRITE}),
    needs=frozenset({"backward_regathers", "recomputed_regions", "yield_feeds"}),
)


def plan_passthrough_buffers(
    graph: onnx.GraphProto, plans: passthrough.BufferPlans, feeds: dict[PythonOpKey, YieldFeed]
) -> BufferPlan:
    """Fix how ort_zero's PythonOps in `graph` return their tensors, in `plans` (see the module docstring); `feeds`:
    what each still gives the YieldOp (`yield_from_makers`)."""
    forward = [node for node in graph.node if is_pass_through(node)]
    by_ctx = {context_of(node): node for node in forward}
    gradient = [node for node in graph.node if gradient_context(node) in by_ctx]
    plan = BufferPlan(python_ops=len(forward))
    for node in forward:
        if feed := feeds.get(python_op_key(node)):
            forward_map = ints_attribute(node, REUSE)
            set_ints_attribute(node, REUSE, [-1 if o and i in feed.copied else i for o, i in enumerate(forward_map)])
            plan.copied_outputs.append(node.name)
    borrowable = _borrowable_grads(graph, forward, gradient, by_ctx, feeds)
    for node in gradient:
        # Forward output o (0 is ctx) is a view of tensor input forward_map[o]; its gradient is this node's input
        # o, and this node's output t is tensor input t's gradient.
        forward_node = by_ctx[gradient_context(node)]
        backward_map = [-1] * len(node.output)
        for output, tensor_input in enumerate(ints_attribute(forward_node, REUSE)):
            if output > 0 and tensor_input in borrowable[python_op_key(forward_node)]:
                backward_map[tensor_input] = output
        set_ints_attribute(node, REUSE, backward_map)
        plan.borrowed_grads += sum(1 for index in backward_map if index >= 0)
    for key, tensor_inputs in borrowable.items():
        copied = feeds[key].copied if key in feeds else frozenset()
        plans.plan(*key, copied=frozenset(copied), borrowed_grads=frozenset(tensor_inputs))
    return plan


def _borrowable_grads(
    graph: onnx.GraphProto,
    forward: list[onnx.NodeProto],
    gradient: list[onnx.NodeProto],
    by_ctx: dict[str, onnx.NodeProto],
    feeds: dict[PythonOpKey, YieldFeed],
) -> dict[PythonOpKey, set[int]]:
    """By PythonOp, the tensor inputs whose gradient every gradient node of it can plan in its output gradient's
    buffer: an alias output's gradient, present, not a graph output, not a model output's."""
    graph_outputs = {value.name for value in graph.output}
    borrowable: dict[PythonOpKey, set[int]] = {python_op_key(node): set() for node in forward}
    has_gradient: set[PythonOpKey] = set()
    for node in gradient:
        forward_node = by_ctx[gradient_context(node)]
        key = python_op_key(forward_node)
        model_outputs = feeds[key].fed if key in feeds else set()
        here = {
            tensor_input
            for output, tensor_input in enumerate(ints_attribute(forward_node, REUSE))
            if output > 0
            and 0 <= tensor_input < len(node.output)
            and tensor_input not in model_outputs
            and output < len(node.input)
            and node.input[output]
            and node.output[tensor_input]
            and node.output[tensor_input] not in graph_outputs
        }
        borrowable[key] = borrowable[key] & here if key in has_gradient else here
        has_gradient.add(key)
    return borrowable
