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
- forward: as each Function's alias map says, except for the outputs that feed the YieldOp (ORT plans no alias for
  a value whose first consumer is the YieldOp): those are copies. Measured before the rule: with ORT's memory reuse
  on, the final LayerNorm's bias gradient was summed from a buffer the backward had already overwritten. A copy of
  every model output was one more logits-sized buffer beside the logits and their log-probabilities at the loss
  (250 MiB per rank at seq 2048, vocab 32000), so the YieldOp reads each model output from the value the bridges
  pass on, and only one output per PythonOp (a scalar where there is one: the loss) from the PythonOp, which keeps
  the PythonOp ordered before the YieldOp.
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
    feeds = _read_from_makers(graph, forward)
    for node in forward:
        if feed := feeds.get(_key(node)):
            forward_map = ints_attribute(node, _REUSE)
            set_ints_attribute(node, _REUSE, [-1 if o and i in feed.copied else i for o, i in enumerate(forward_map)])
            plan.copied_outputs.append(node.name)
    borrowable = _borrowable_grads(graph, forward, gradient, by_ctx, feeds)
    for node in gradient:
        # Forward output o (0 is ctx) is a view of tensor input forward_map[o]; its gradient is this node's input
        # o, and this node's output t is tensor input t's gradient.
        forward_node = by_ctx[node.input[0]]
        backward_map = [-1] * len(node.output)
        for output, tensor_input in enumerate(ints_attribute(forward_node, _REUSE)):
            if output > 0 and tensor_input in borrowable[_key(forward_node)]:
                backward_map[tensor_input] = output
        set_ints_attribute(node, _REUSE, backward_map)
        plan.borrowed_grads += sum(1 for index in backward_map if index >= 0)
    for key, tensor_inputs in borrowable.items():
        copied = feeds[key].copied if key in feeds else frozenset()
        plans.plan(*key, copied=frozenset(copied), borrowed_grads=frozenset(tensor_inputs))
    return plan


@dataclass
class YieldFeed:
    """What one pass-through PythonOp gives the YieldOp: its tensor inputs that are model outputs (`fed`) and those
    of them the YieldOp still reads from the PythonOp (`copied`: the PythonOp returns copies of them)."""

    fed: set[int] = field(default_factory=set)
    copied: set[int] = field(default_factory=set)


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
    borrowable: dict[PythonOpKey, set[int]] = {_key(node): set() for node in forward}
    has_gradient: set[PythonOpKey] = set()
    for node in gradient:
        key = _key(by_ctx[node.input[0]])
        model_outputs = feeds[key].fed if key in feeds else set()
        here = {
            tensor_input
            for output, tensor_input in enumerate(ints_attribute(by_ctx[node.input[0]], _REUSE))
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


def _key(node: onnx.NodeProto) -> PythonOpKey:
    return function_name_of(node) or "", tuple(ints_attribute(node, "input_int_scalars"))


def _read_from_makers(graph: onnx.GraphProto, forward: list[onnx.NodeProto]) -> dict[PythonOpKey, YieldFeed]:
    """The YieldOp reads each model output from the value the pass-through PythonOps pass on, but for one output per
    PythonOp (a scalar where it has one), which keeps that PythonOp ordered before the YieldOp, and for the values
    that are graph inputs or initializers."""
    yield_op = next((node for node in graph.node if node.op_type == "YieldOp"), None)
    if yield_op is None:
        return {}
    producer = {value: node for node in graph.node for value in node.output}
    pass_through = {id(node): node for node in forward}
    not_made = {value.name for value in graph.input} | {tensor.name for tensor in graph.initializer}
    ranks = {info.name: len(info.type.tensor_type.shape.dim) for info in (*graph.value_info, *graph.output)}
    fed: dict[int, list[tuple[int, int]]] = {}  # PythonOp -> (YieldOp input, its tensor input) it feeds
    for index, value in enumerate(yield_op.input):
        value = _before_identities(value, producer)
        node = producer.get(value)
        if node is not None and id(node) in pass_through:
            tensor_input = ints_attribute(node, _REUSE)[list(node.output).index(value)]
            fed.setdefault(id(node), []).append((index, tensor_input))
    feeds: dict[PythonOpKey, YieldFeed] = {}
    for node_id, outputs in fed.items():
        kept = min(outputs, key=lambda output: (ranks.get(yield_op.input[output[0]]) != 0, output[0]))
        feed = feeds.setdefault(_key(pass_through[node_id]), YieldFeed())
        for index, tensor_input in outputs:
            feed.fed.add(tensor_input)
            maker = _maker(pass_through[node_id].input[tensor_input], producer, pass_through)
            if (index, tensor_input) == kept or maker in not_made:
                feed.copied.add(tensor_input)
            else:
                yield_op.input[index] = maker
    return feeds


def _before_identities(value: str, producer: dict[str, onnx.NodeProto]) -> str:
    while (node := producer.get(value)) is not None and node.op_type == "Identity":
        value = node.input[0]
    return value


def _maker(value: str, producer: dict[str, onnx.NodeProto], pass_through: dict[int, onnx.NodeProto]) -> str:
    """The value that Identities and pass-through PythonOps pass on as `value`."""
    while True:
        value = _before_identities(value, producer)
        node = producer.get(value)
        if node is None or id(node) not in pass_through:
            return value
        tensor_input = ints_attribute(node, _REUSE)[list(node.output).index(value)]
        if tensor_input < 0:
            return value
        value = node.input[tensor_input]
