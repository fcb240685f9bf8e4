"""Training-graph pass: the YieldOp reads each model output from the kernel that made it, not from a bridge's copy.

The model's outputs leave the forward through the root module's post-forward bridge (and every bridge between the
kernel that made them and it). ORT plans no alias for a value whose first consumer is the YieldOp, so a bridge
output the YieldOp read had to be a copy (`passthrough_buffers`): at the loss, a third logits-sized buffer beside the
logits and their log-probabilities (250 MiB per rank at seq 2048, vocab 32000). The YieldOp now reads each model
output from the value the bridges pass on, but for one output per bridge (a scalar where there is one: the loss),
which keeps that bridge ordered before the YieldOp, and for values that are graph inputs or initializers. What it
leaves each bridge to feed (`YieldFeed`) is what `passthrough_buffers` plans as copies.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import onnx

from ...hooks.passthrough import PythonOpKey
from ..graph.pass_through import (
    before_identities,
    is_pass_through,
    made_by,
    passed_through_input,
    producers,
    python_op_key,
    yield_op_of,
)
from .base import GraphPass, TrainingGraph, YieldFeed
from .contract import Edit

logger = logging.getLogger(__name__)


@dataclass
class ReadFromMakers:
    """What the pass did, for the log: the YieldOp inputs it now reads from the kernels that made them."""

    rewired: list[str] = field(default_factory=list)

    def log(self) -> None:
        if self.rewired:
            logger.info("ort_zero: the YieldOp reads %s from the kernels that made them", ", ".join(self.rewired))


def run(training: TrainingGraph) -> ReadFromMakers:
    report = ReadFromMakers()
    training.yield_feeds = read_from_makers(training.graph, report)
    return report


# After scalar_output_grads, which names the model outputs as the YieldOp read them from the bridges.
PASS = GraphPass("yield_from_makers", run, edits=frozenset({Edit.REWIRE}), provides=frozenset({"yield_feeds"}))


def read_from_makers(graph: onnx.GraphProto, report: ReadFromMakers | None = None) -> dict[PythonOpKey, YieldFeed]:
    """Rewire the YieldOp of `graph` (see the module docstring); by pass-through PythonOp, what it still feeds."""
    yield_op = yield_op_of(graph)
    if yield_op is None:
        return {}
    producer = producers(graph)
    not_made = {value.name for value in graph.input} | {tensor.name for tensor in graph.initializer}
    ranks = {info.name: len(info.type.tensor_type.shape.dim) for info in (*graph.value_info, *graph.output)}
    fed: dict[int, list[tuple[int, int]]] = {}  # PythonOp -> (YieldOp input, its tensor input) it feeds
    bridges: dict[int, onnx.NodeProto] = {}
    for index, value in enumerate(yield_op.input):
        value = before_identities(value, producer)
        node = producer.get(value)
        if node is not None and is_pass_through(node):
            bridges[id(node)] = node
            fed.setdefault(id(node), []).append((index, passed_through_input(node, value)))
    feeds: dict[PythonOpKey, YieldFeed] = {}
    for node_id, outputs in fed.items():
        kept = min(outputs, key=lambda output: (ranks.get(yield_op.input[output[0]]) != 0, output[0]))
        node = bridges[node_id]
        feed = feeds.setdefault(python_op_key(node), YieldFeed())
        for index, tensor_input in outputs:
            feed.fed.add(tensor_input)
            maker = made_by(node.input[tensor_input], producer)
            if (index, tensor_input) == kept or maker in not_made:
                feed.copied.add(tensor_input)
            else:
                yield_op.input[index] = maker
                if report is not None:
                    report.rewired.append(maker)
    return feeds
