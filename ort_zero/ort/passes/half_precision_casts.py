"""Training-graph pass: a node the session's provider cannot run in bfloat16 or float16 computes in float32.

A bf16 model's graph is bf16 throughout, and ORT 1.19.2's CPU provider has bf16 kernels for Cast and the
data-movement ops only: not for Add, Mul, ReduceMean, Sigmoid, nor the fused RMSNorm its own optimizer writes
(`SimplifiedLayerNormalization`), so the session refuses the graph (NOT_IMPLEMENTED). The heavy ops (linear layers,
attention, experts, the loss) already run as torch's kernels in PythonOps, in the model's dtype. Every other node
the provider has no kernel for (asked of the provider: `graph.kernels`) reads its 16-bit inputs through a Cast to
float32, and its 16-bit outputs are Cast back, where it writes them. That is what torch's own CPU kernels do with
bf16 elementwise math (compute in float32, round the result once), so values and gradients keep the model's dtype
between nodes, and what the forward keeps for the backward stays 16-bit: each backward node widens its own inputs.
On CUDA, where ORT has the kernels, the pass changes nothing.

The backward's Casts must stay the backward's: ORT's session-level common-subexpression elimination would merge each
with the forward's Cast of the same value, and the float32 copy would then live from the forward to the backward
(measured: +370 MiB per rank, 162M LLaMA at seq 1024). Sessions of graphs this pass changed run without it
(`ortmodule.graph_execution_manager.session_options`).

A node that has no float32 kernel either cannot run at all: that is one error naming the op and the module.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

import onnx

from ..graph.kernels import has_kernel
from ..graph.types import value_types
from ..graph.widening import HALF_TYPES, declares_16_bit, half_values, widened
from .base import GraphPass, TrainingGraph
from .contract import Edit

logger = logging.getLogger(__name__)

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


@dataclass
class HalfPrecisionCasts:
    """What the pass did to one training graph: per op type, how many nodes now compute in float32."""

    widened: Counter = field(default_factory=Counter)
    casts: int = 0

    def log(self) -> None:
        if self.widened:
            ops = ", ".join(f"{op} {count}" for op, count in sorted(self.widened.items()))
            logger.info(
                "ort_zero: %d nodes without a 16-bit kernel on this device compute in float32 between %d Casts (%s)",
                sum(self.widened.values()),
                self.casts,
                ops,
            )


class UnsupportedOpError(RuntimeError):
    """An op the session's provider cannot run in the model's dtype nor in float32."""


def run(training: TrainingGraph) -> HalfPrecisionCasts:
    if not declares_16_bit(training.graph):
        return HalfPrecisionCasts()  # a float32 model's graph: no type inference for it
    return widen_unsupported(training.graph, training.device, list(training.opsets), training.element_types())


def widen_unsupported(
    graph: onnx.GraphProto, device: str, opsets: list[onnx.OperatorSetIdProto], types: dict[str, int] | None = None
) -> HalfPrecisionCasts:
    """The pass on any graph ORT is about to build a session of (the training graph, or ORTModule's inference
    graph) for a device of type `device`; `types`: its values' element types where known already."""
    report = HalfPrecisionCasts()
    if not declares_16_bit(graph):
        return report  # a float32 model's graph: no type inference for it
    types = types if types is not None else value_types(graph, opsets)
    provider = PROVIDERS.get(device, "CPUExecutionProvider")
    nodes: list[onnx.NodeProto] = []
    for position, node in enumerate(graph.node):
        if not half_values(node, types) or has_kernel(node, types, opsets, provider):
            nodes.append(node)
            continue
        before, wide, after = widened(node, node.name or f"{node.op_type}_{position}", types)
        report.widened[node.op_type] += 1
        report.casts += len(before) + len(after)
        if not has_kernel(wide, types, opsets, provider):
            raise UnsupportedOpError(_unsupported(node, types, device))
        nodes += [*before, wide, *after]
    del graph.node[:]
    graph.node.extend(nodes)
    return report


def _unsupported(node: onnx.NodeProto, types: dict[str, int], device: str) -> str:
    dtype = next(HALF_TYPES[types[name]] for name in (*node.input, *node.output) if types.get(name) in HALF_TYPES)
    return missing_kernel_message(node.op_type, node.name, device, f"{dtype} nor in float32") + (
        f": train this model in float32 in ORT (no {dtype} section in the DeepSpeed config), or without ORTModule"
    )


def missing_kernel_message(op_type: str, node_name: str, device: str, dtypes: str) -> str:
    """The one line that says ORT has no kernel for a node: the op, the module it came from, the node."""
    return f"ort_zero: ONNX Runtime has no {device} kernel for {op_type} in {dtypes} ({node_location(node_name)})"


def node_location(node_name: str) -> str:
    """Where an exported node (or value) comes from: the module the exporter named it after, and its name."""
    module = ".".join(part for part in node_name.split("/")[:-1] if part and part != "_original_module")
    return f"{f'module {module!r}' if module else 'the model'}, node '{node_name}'"


# Last: every node the other passes insert or copy (recompute's copies, the backward's gathers) is covered too.
PASS = GraphPass("half_precision_casts", run, edits=frozenset({Edit.INSERT, Edit.REWIRE}))
