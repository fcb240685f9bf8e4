"""Training-graph pass: a model output whose gradient ORT only adds to one it computes itself takes a scalar zero.

ORT's graph builder (onnxruntime 1.19.2) asks ORTModule for a zero tensor of an output's full shape wherever the
caller's gradient of that output enters the backward graph by itself, and torch's exporter names every output
through an Identity, so every output qualifies: a causal LM's logits ([tokens, vocab]: 250 MiB at seq 2048, vocab
32000) and, with `use_cache`, every layer's keys and values. When the loss is computed inside the model, PyTorch
gives no gradient for them and ORTModule allocates those zeros at the start of every backward, which is where the
step's memory peaks. Where the output's gradient only reaches `Sum` nodes that add it to the gradient ORT computes
for the same value (through Identities), a scalar zero gives the same sums (ORT's Sum broadcasts): the pass takes
such outputs out of the YieldOp's `full_shape_outputs`, and the manager's graph info follows
(`ortmodule.training_manager.graph_optimizers`). A gradient the caller does give is passed on as before.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from ...python_op import ints_attribute, set_ints_attribute
from ..graph.pass_through import GradientPaths, is_op, yield_op_of
from .base import GraphPass, TrainingGraph
from .contract import Edit

logger = logging.getLogger(__name__)
_FULL_SHAPE = "full_shape_outputs"
_NOT_DIFFERENTIABLE = "non_differentiable_outputs"


@dataclass
class ScalarOutputGrads:
    """What the pass did, for the log: the model outputs whose missing gradient is now a scalar zero."""

    outputs: list[str] = field(default_factory=list)

    def log(self) -> None:
        if self.outputs:
            logger.info(
                "ort_zero: %d model outputs (%s) take a scalar zero as their gradient when PyTorch gives none",
                len(self.outputs),
                ", ".join(self.outputs),
            )


def run(training: TrainingGraph) -> ScalarOutputGrads:
    report = ScalarOutputGrads()
    graph = training.graph
    yield_op = yield_op_of(graph)
    if yield_op is None:
        return report
    graph_outputs = {output.name for output in graph.output}
    full_shape = ints_attribute(yield_op, _FULL_SHAPE)
    not_differentiable = set(ints_attribute(yield_op, _NOT_DIFFERENTIABLE))
    # the YieldOp's outputs: the gradients of its differentiable inputs, in order (later inputs are cached values)
    differentiable = [index for index in range(len(yield_op.input)) if index not in not_differentiable]
    gradient_of = dict(zip(differentiable, yield_op.output, strict=False))
    paths = GradientPaths.of(graph)
    from_caller = paths.everything_made_of(set(gradient_of.values()))
    scalar = [
        index
        for index in full_shape
        if index in gradient_of and _only_added(paths, gradient_of[index], graph_outputs, from_caller)
    ]
    if scalar:
        set_ints_attribute(yield_op, _FULL_SHAPE, [index for index in full_shape if index not in scalar])
        # their full shapes are no longer what the graph says of them
        now_scalar = paths.everything_made_of({gradient_of[index] for index in scalar})
        kept = [info for info in graph.value_info if info.name not in now_scalar]
        del graph.value_info[:]
        graph.value_info.extend(kept)
        training.scalar_output_grads = scalar
        report.outputs = [yield_op.input[index] for index in scalar]
    return report


def _only_added(paths: GradientPaths, value: str, graph_outputs: set[str], from_caller: set[str]) -> bool:
    """Every use of `value`, passed on unchanged, is an input of a Sum that also adds a gradient ORT computed (so
    the sum keeps that gradient's shape); none is a graph output."""
    if value in graph_outputs or not paths.consumers.get(value):
        return False
    for node in paths.consumers[value]:
        made = paths.passed_on(value, node)
        if made is not None:
            if not made or not all(_only_added(paths, m, graph_outputs, from_caller) for m in made):
                return False
        elif not (is_op(node, "Sum") and any(name not in from_caller for name in node.input)):
            return False
    return True


# Before passthrough_buffers, which drops the alias maps of the bridges that feed the YieldOp, and before
# yield_from_makers, which changes what the YieldOp reads (its report names the outputs as the bridges passed them).
PASS = GraphPass("scalar_output_grads", run, edits=frozenset({Edit.REWRITE}))
