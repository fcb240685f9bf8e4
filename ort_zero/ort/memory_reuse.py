"""ORT's memory reuse for ZeRO-3 training sessions.

ORTModule builds every session with `enable_mem_reuse=False`, because a PythonOp's torch code may keep tensors that
ORT's planner believes dead (ORT would write later values into them). Without reuse ORT's planner still frees
values, but hands no freed buffer on: measured, a ZeRO-3 step with ort_zero's layer-wise recompute peaked at 330 MiB
per rank with reuse off against 131 MiB with it on (small GPT, 8 blocks, CPU arena off).

ort_zero turns reuse on for a ZeRO-3 training graph whose PythonOps are all ort_zero's own, which keep nothing ORT
may overwrite once reuse is on (`settings.ort_memory_reuse`):
- tensors they hand to ORT that PyTorch still owns (gathered parameters) are copies (`zero3.bridges`);
- gradients they hand to DeepSpeed (`param.backward`) are copies, as DeepSpeed may keep them until it reduces;
- everything else they return is either new (ORT owns it alone) or a view ORT knows of (their alias maps), except
  before ORT's YieldOp, where ORT plans no alias: there they return copies (`yield_copies`).
A graph with anybody else's autograd Function keeps ORTModule's setting, and ort_zero says so.

Opt-in (ORT_ZERO_MEMORY_REUSE=1) while two measured costs stand: the parameter copies are held until the backward
(ORT keeps its PythonOps' outputs until then: a Linear stack held 128 MiB per rank between forward and backward
against native's 8), and a model whose checkpoints became ort_zero's recompute aborted on its first ORT step
(tests/distributed/scripts/run_zero3_checkpointing.py, not yet diagnosed).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import onnx

from .. import settings
from ..hooks.statistics import EndStep, RecordStatistics
from ..zero3 import bridges
from .graph import func_name, is_zero3_graph, qualified_name
from .zero3_rewrite import ParamPull

logger = logging.getLogger(__name__)

REUSE_SAFE_FUNCTIONS = frozenset(
    qualified_name(function)
    for function in (
        bridges.StepStartBridge,
        bridges.PreForwardBridge,
        bridges.PostForwardBridge,
        bridges.BackwardParamsBridge,
        bridges.RecomputeStartBridge,
        bridges.RecomputeParamsBridge,
        ParamPull,
        RecordStatistics,
        EndStep,
    )
)
"""ort_zero's Functions that keep nothing ORT could overwrite once `settings.ort_memory_reuse` is on."""

_announced: set[tuple[str, ...]] = set()


def foreign_functions(graph: onnx.GraphProto) -> list[str]:
    """The autograd Functions in `graph`'s PythonOps that are not ort_zero's reuse-safe ones."""
    names = {func_name(node) for node in graph.node if node.op_type == "PythonOp"}
    return sorted(names - REUSE_SAFE_FUNCTIONS)


def allowed(graph: onnx.GraphProto) -> bool:
    """Whether ORT may reuse memory in this training graph: a ZeRO-3 graph of ort_zero's own PythonOps only (and
    asked for with ORT_ZERO_MEMORY_REUSE=1). A graph with other Functions is announced once."""
    if os.environ.get("ORT_ZERO_MEMORY_REUSE", "0") != "1" or not is_zero3_graph(graph):
        return False
    foreign = foreign_functions(graph)
    if foreign and tuple(foreign) not in _announced:
        _announced.add(tuple(foreign))
        logger.warning(
            "ort_zero: ORT's memory reuse stays off for this ZeRO-3 model (activation memory as ORTModule's "
            "default): its graph calls autograd Functions ort_zero does not own (%s), whose kept tensors ORT could "
            "overwrite",
            ", ".join(foreign),
        )
    return not foreign


def enable(session_options: Any, graph: onnx.GraphProto) -> bool:
    """Turn ORT's memory reuse on in `session_options` for the training session of `graph` if `allowed`."""
    if not allowed(graph):
        return False
    settings.ort_memory_reuse = True
    session_options.enable_mem_reuse = True
    return True
