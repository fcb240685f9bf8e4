"""Evidence of what an ORTModule really ran: its ONNX Runtime sessions and the PythonOps in their graphs.

A model that fell back to PyTorch computes the same numbers, so run records and tests check this instead.
"""

from __future__ import annotations

from typing import Any

import torch

from ..foreign import onnxruntime as ort_internals
from ..python_op import function_name_of
from .graph.widening import widened_record
from .passes.backward_gather import forward_gathered_reads
from .passes.recompute import recompute_record


def ort_run_record(model: torch.nn.Module) -> dict[str, Any]:
    """For an ORTModule (or a module wrapping one as `.module`, like a DeepSpeed engine): per mode ("training",
    "inference"), whether an ORT session exists, the execution providers it runs on (a model on CUDA must show
    CUDAExecutionProvider first), whether its CPU arena is on, the sorted func names of its graph's PythonOps (the
    torch kernels that ran among them) and, per op type, the nodes that computed in float32 for want of a 16-bit
    kernel (`ort_zero.ort.passes.half_precision_casts`);
    for training, also the backward reads of ZeRO-3 parameters gathered in the forward (each keeps a gathered copy
    alive) and what ort_zero's layer-wise recompute applied (`ort_zero.ort.passes.recompute.recompute_record`)."""
    ort_module = model if ort_internals.is_ort_module(model) else getattr(model, "module", model)
    if not ort_internals.is_ort_module(ort_module):
        raise TypeError(f"{type(ort_module).__name__} is not an ORTModule")
    record = {}
    for mode, is_training in (("training", True), ("inference", False)):
        manager = ort_internals.execution_manager(ort_module, training=is_training)
        model_proto, session = ort_internals.optimized_model(manager), ort_internals.session(manager)
        graph = model_proto.graph if model_proto else None
        record[mode] = {
            "session": session is not None,
            "providers": session.get_providers() if session is not None else [],
            "cpu_mem_arena": session.get_session_options().enable_cpu_mem_arena if session is not None else None,
            "python_ops": sorted({name for node in graph.node if (name := function_name_of(node))}) if graph else [],
            "float32_fallbacks": widened_record(graph),
        }
        if is_training:
            record[mode]["backward_reads_of_forward_gathers"] = forward_gathered_reads(graph) if graph else []
            record[mode]["recompute"] = recompute_record(graph) if graph else recompute_record(None)
    return record
