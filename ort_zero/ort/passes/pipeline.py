"""The one ordered pipeline of ort_zero's graph passes: which run on the exported graph, which on the training graph.

export (ORTModule's post-export processing, per export):
    same_type_casts       identity Casts whose output one node reads twice go (ORT's cast propagation fails on them)
    half_precision_schemas  bf16 nodes ORT's schemas or gradients do not take compute in float32 between Casts
    grouped_conv_1d       grouped one-axis Convs become two-axis Convs (ORT's ConvGrad overruns dX on them)
    custom_gradients      no node sets an attribute the gradient ort_zero registered for its op does not handle
    zero3_params          ZeRO-3 parameters leave the graph inputs; pre-forward bridges provide them
    gradient_free_bypass  bridge outputs no gradient can reach are read from the bridges' inputs
    mem_efficient_grads   other trainable parameters get a PythonOp that hands their gradient to PyTorch
    unchecked_kernels     ORT runs the torch-kernel PythonOps without its first-run copies of their inputs
training graph (ORT's graph-optimizer registry, before the session exists):
    backward_gather       each module's backward reads its parameters gathered again for it
    recompute             layer-wise recompute at ORTMODULE_MEMORY_OPT_LEVEL 1/2 (and Dropout seeds)
    scalar_output_grads   a model output whose gradient ORT only adds to its own takes a scalar zero when none is given
    yield_from_makers     the YieldOp reads model outputs from the kernels that made them, not from bridge copies
    passthrough_buffers   ORT's buffer plan alone owns what the pass-through PythonOps return
    gradient_sums         on the CPU, a 16-bit model's gradient sums run as torch's adds in a PythonOp
    sixteen_bit_splits    16-bit Splits the provider cannot run move their data as Slices in 16 bits
    half_precision_casts  nodes the provider cannot run in bf16/fp16 compute in float32 between Casts
"""

from __future__ import annotations

from collections.abc import Sequence

from ... import settings
from . import (
    backward_gather,
    custom_gradients,
    gradient_free_bypass,
    gradient_sums,
    grouped_conv_1d,
    half_precision_casts,
    half_precision_schemas,
    mem_efficient_grads,
    passthrough_buffers,
    recompute,
    same_type_casts,
    scalar_output_grads,
    sixteen_bit_splits,
    unchecked_kernels,
    yield_from_makers,
    zero3_params,
)
from .base import ExportedGraph, GraphPass, PassReport, TrainingGraph
from .contract import edits_made, snapshot, undeclared

EXPORT_PASSES: tuple[GraphPass, ...] = (
    same_type_casts.PASS,
    half_precision_schemas.PASS,
    grouped_conv_1d.PASS,
    custom_gradients.PASS,
    zero3_params.PASS,
    gradient_free_bypass.PASS,
    mem_efficient_grads.PASS,
    unchecked_kernels.PASS,
)
TRAINING_GRAPH_PASSES: tuple[GraphPass, ...] = (
    backward_gather.PASS,
    recompute.PASS,
    scalar_output_grads.PASS,
    yield_from_makers.PASS,
    passthrough_buffers.PASS,
    gradient_sums.PASS,
    sixteen_bit_splits.PASS,
    half_precision_casts.PASS,
)


def unmet_needs(passes: Sequence[GraphPass]) -> list[str]:
    """Every need no earlier pass provides, as "pass: need" (empty for a well-ordered pipeline)."""
    provided: set[str] = set()
    unmet = []
    for graph_pass in passes:
        unmet += [f"{graph_pass.name}: {need}" for need in sorted(graph_pass.needs - provided)]
        provided |= graph_pass.provides
    return unmet


def run_export_passes(graph: ExportedGraph) -> list[PassReport]:
    return _run(EXPORT_PASSES, graph)


def run_training_graph_passes(graph: TrainingGraph) -> list[PassReport]:
    return _run(TRAINING_GRAPH_PASSES, graph)


def _run(passes: Sequence[GraphPass], graph: ExportedGraph | TrainingGraph) -> list[PassReport]:
    reports = []
    for graph_pass in passes:
        if missing := graph_pass.needs - graph.provided:
            raise RuntimeError(f"ort_zero: graph pass {graph_pass.name} needs {sorted(missing)}, not provided")
        report = _run_checked(graph_pass, graph) if settings.check_passes() else graph_pass.run(graph)
        report.log()
        graph.provided |= graph_pass.provides
        reports.append(report)
    return reports


def _run_checked(graph_pass: GraphPass, graph: ExportedGraph | TrainingGraph) -> PassReport:
    """`graph_pass` run between two snapshots of the graph: an edit it does not declare is an error (`contract`)."""
    onnx_graph = graph.model.graph if isinstance(graph, ExportedGraph) else graph.graph
    before = snapshot(onnx_graph)
    report = graph_pass.run(graph)
    if error := undeclared(graph_pass.name, graph_pass.edits, edits_made(before, snapshot(onnx_graph))):
        raise RuntimeError(error)
    return report
