"""Export pass: a bf16 node ORT cannot build a graph of computes in float32 between Casts.

Before any kernel is asked for, ORT checks the exported graph against its op schemas, and builds the gradient graph
from its own gradient definitions. Some ops have no bfloat16 in either (ORT 1.19.2, checked one op at a time in
tests/unit/ort/passes/test_half_precision_schemas.py):
- ONNX's schema at the model's opset: TopK (every MoE router that ranks bf16 scores: DBRX, GPT-OSS, Llama 4, Aria),
  EyeLike (XLNet);
- the gradient: Div's is a function whose ReduceSumTraining takes no bf16 (Gemma 3n).
ORT then refuses the graph with a type error, and the model cannot train. Such a node reads its 16-bit inputs
through Casts to float32 and writes its outputs back in their type (`graph.widening`), as torch's CPU kernels compute
16-bit elementwise math, so nothing else in the graph changes. float16 has these schemas and gradients: only bf16
nodes are widened. A node ORT can build but has no bf16 kernel for is the training-graph pass
`half_precision_casts`'s.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

import onnx
from onnx import TensorProto

from ..graph.types import value_types
from ..graph.widening import declares_16_bit, widened
from .base import ExportedGraph, GraphPass
from .contract import Edit

logger = logging.getLogger(__name__)

NO_BF16_GRADIENT = frozenset({"Div"})  # ORT's gradient of these cannot be built for bf16 inputs
_BF16 = "tensor(bfloat16)"


@dataclass
class WidenedForSchemas:
    """Per op type, how many exported nodes now compute in float32 because ORT cannot build them in bf16."""

    widened: Counter = field(default_factory=Counter)

    def log(self) -> None:
        if self.widened:
            ops = ", ".join(f"{op} {count}" for op, count in sorted(self.widened.items()))
            logger.info("ort_zero: %d bf16 nodes ORT cannot build in bf16 compute in float32 (%s)",
                        sum(self.widened.values()), ops)  # fmt: skip


def _bf16_values(node: onnx.NodeProto, types: dict[str, int]) -> list[tuple[int, str, bool]]:
    """(index, value, is_input) of each of the node's bf16 inputs and outputs."""
    values = [(index, name, True) for index, name in enumerate(node.input)]
    values += [(index, name, False) for index, name in enumerate(node.output)]
    return [value for value in values if value[1] and types.get(value[1]) == TensorProto.BFLOAT16]


def _schema_refuses_bf16(node: onnx.NodeProto, bf16: list[tuple[int, str, bool]], opsets: dict[str, int]) -> bool:
    """Whether ONNX's schema of the node's op, at the model's opset, leaves bfloat16 out where the node has it."""
    domain = node.domain or ""
    if domain not in ("", "ai.onnx") or not onnx.defs.has(node.op_type, domain):
        return False  # ORT's own ops: their schemas are not ONNX's to read here
    schema = onnx.defs.get_schema(node.op_type, opsets.get(domain, opsets.get("", 1)), domain)
    allowed = {constraint.type_param_str: constraint.allowed_type_strs for constraint in schema.type_constraints}
    for index, _, is_input in bf16:
        formals = schema.inputs if is_input else schema.outputs
        if not formals:
            continue
        formal = formals[min(index, len(formals) - 1)]
        if _BF16 not in allowed.get(formal.type_str, [formal.type_str]):
            return True
    return False


def run(exported: ExportedGraph) -> WidenedForSchemas:
    report = WidenedForSchemas()
    graph = exported.model.graph
    if not declares_16_bit(graph):
        return report
    opset_imports = list(exported.model.opset_import)
    opsets = {("" if entry.domain == "ai.onnx" else entry.domain): entry.version for entry in opset_imports}
    types = value_types(graph, opset_imports)
    nodes: list[onnx.NodeProto] = []
    for position, node in enumerate(graph.node):
        bf16 = _bf16_values(node, types)
        no_gradient = exported.training and node.op_type in NO_BF16_GRADIENT and node.domain in ("", "ai.onnx")
        if not bf16 or not (no_gradient or _schema_refuses_bf16(node, bf16, opsets)):
            nodes.append(node)
            continue
        before, wide, after = widened(node, node.name or f"{node.op_type}_{position}", types)
        nodes += [*before, wide, *after]
        report.widened[node.op_type] += 1
    del graph.node[:]
    graph.node.extend(nodes)
    return report


PASS = GraphPass("half_precision_schemas", run, edits=frozenset({Edit.INSERT, Edit.REWIRE}))
