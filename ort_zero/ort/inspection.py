"""Evidence of what an ORTModule really ran: its ONNX Runtime sessions and the PythonOps in their graphs.

A model that fell back to PyTorch computes the same numbers, so run records and tests check this instead.
"""

from __future__ import annotations

from typing import Any

import torch

from .graph import func_name
from .passes.backward_gather import forward_gathered_reads
from .passes.recompute import recompute_record


def ort_run_record(model: torch.nn.Module) -> dict[str, Any]:
    """For an ORTModule (or a module wrapping one as `.module`, like a DeepSpeed engine): per mode ("training",
    "inference"), whether an ORT session exists, the execution providers it runs on (a model on CUDA must show
    CUDAExecutionProvider first) and the sorted func names of its graph's PythonOps; for training, also the backward
    reads of ZeRO-3 parameters gathered in the forward (each keeps a gathered copy alive) and what ort_zero's
    layer-wise recompute applied (`ort_zero.ort.passes.recompute.recompute_record`)."""
    ort_module = model if hasattr(model, "_torch_module") else getattr(model, "module", model)
    if not hasattr(ort_module, "_torch_module"):
        raise TypeError(f"{type(ort_module).__name__} is not an ORTModule")
    record = {}
    for mode, is_training in (("training", True), ("inference", False)):
        manager = ort_module._torch_module._execution_manager(is_training=is_training)
        graph = manager._onnx_models.optimized_model.graph if manager._onnx_models.optimized_model else None
        agent = manager._execution_agent
        record[mode] = {
            "session": agent is not None,
            "providers": agent._inference_session.get_providers() if agent is not None else [],
            "python_ops": sorted({name for node in graph.node if (name := func_name(node))}) if graph else [],
        }
        if is_training:
            record[mode]["backward_reads_of_forward_gathers"] = forward_gathered_reads(graph) if graph else []
            record[mode]["recompute"] = recompute_record(graph) if graph else recompute_record(None)
    return record
