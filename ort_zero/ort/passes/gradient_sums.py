"""Training-graph pass: on the CPU, a 16-bit model's gradient sums run as torch's adds in a PythonOp.

Where a forward value feeds several nodes, ORT's backward adds its gradients with a `Sum` node. ORT 1.19.2's CPU
provider has no 16-bit Sum, so `half_precision_casts` would compute each in float32 between Casts: on a 162M LLaMA
at seq 1024, bf16, 73 Sums and their Casts took 0.7 s of a step (ORT's profiler, 2026-11-29), the largest the
logits' ([seq, vocab]) with the scalar zero `scalar_output_grads` gives when PyTorch gives that output no gradient.
Each such Sum becomes a PythonOp of `step.functions.SumOfGradients`: torch's bf16 adds, one after the other as
torch's autograd accumulates a gradient in native ZeRO-3, and the scalar zero skipped. On other devices ORT has the
kernel.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import onnx

from ...python_op import function_name, make_python_op
from ..graph.edit import register_function
from ..graph.widening import HALF_TYPES, declares_16_bit
from ..step.functions import SumOfGradients
from ..step.torch_kernels.devices import FASTER_IN_TORCH_ON
from .base import GraphPass, TrainingGraph
from .contract import Edit
from .unchecked_kernels import unchecked

logger = logging.getLogger(__name__)
_GRAD_SUFFIX = "_grad"  # ORT names the gradient of value X "X_grad"


@dataclass
class GradientSumsInTorch:
    replaced: int = 0

    def log(self) -> None:
        if self.replaced:
            logger.info("ort_zero: %d 16-bit gradient sums run as torch's adds", self.replaced)


def _ranks(graph: onnx.GraphProto) -> dict[str, int]:
    values = (*graph.input, *graph.value_info, *graph.output)
    return {v.name: len(v.type.tensor_type.shape.dim) for v in values if v.type.tensor_type.HasField("shape")}


def run(training: TrainingGraph) -> GradientSumsInTorch:
    report = GradientSumsInTorch()
    graph = training.graph
    if training.device not in FASTER_IN_TORCH_ON or not declares_16_bit(graph):
        return report
    types, ranks = training.element_types(), _ranks(graph)
    for position, node in enumerate(graph.node):
        if node.op_type != "Sum" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
            continue
        out = node.output[0]
        rank = ranks.get(out, ranks.get(out.removesuffix(_GRAD_SUFFIX)))  # a gradient has its value's shape
        elem_type = types.get(out)
        if elem_type not in HALF_TYPES or rank is None or any(types.get(name) != elem_type for name in node.input):
            continue
        inputs = [(name, ranks.get(name, rank), elem_type) for name in node.input]
        replacement = make_python_op(
            function_name(SumOfGradients), node.name or f"ort_zero_gradient_sum_{position}", [len(inputs)], inputs,
            [(out, rank, elem_type)], training_mode=0,
        )  # fmt: skip
        unchecked(replacement)
        graph.node[position].CopyFrom(replacement)
        report.replaced += 1
    if report.replaced:
        register_function(SumOfGradients)
    return report


# Before half_precision_casts (what it leaves needs no Casts); after scalar_output_grads, which reads the Sums.
PASS = GraphPass("gradient_sums", run, edits=frozenset({Edit.REWIRE, Edit.REWRITE}))
