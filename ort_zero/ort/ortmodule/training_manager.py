"""ORTModule's `TrainingManager`, where a training session is built: ort_zero's training-graph passes run inside
ORT's graph-optimizer registry, ORT's own memory optimizer stays off for ZeRO-3 graphs, and what the manager keeps
beyond its needs goes once the session exists.

Each function takes the original ORT object and returns its replacement (the registry's factory protocol).
"""

from __future__ import annotations

import contextvars
import functools
import logging
from collections.abc import Callable
from typing import Any

from ... import settings
from ...foreign import onnxruntime as ort_internals
from ...memory.footprint import trim_after_each_backward, trim_training_manager
from ...zero3 import external_params
from ..graph.edit import is_zero3_graph
from ..passes.base import TrainingGraph
from ..passes.pipeline import run_training_graph_passes

logger = logging.getLogger(__name__)

# The TrainingManager whose `_build_graph` is running (set by `graph_built_by`), for the training-graph passes.
_BUILDING: contextvars.ContextVar[Any] = contextvars.ContextVar("ort_zero_building_manager", default=None)


def graph_optimizers(original: Any) -> Any:
    """Wraps ORT's graph-optimizer registry run on the training graph: ORT's optimizers, then ort_zero's
    training-graph passes (`passes.pipeline`; a graph without ort_zero's PythonOps is left alone)."""

    def optimize_all(cls: type, module_name: str, device: str, graph: Any) -> None:
        original.__get__(None, cls)(module_name, device, graph)
        manager = _BUILDING.get()
        model = ort_internals.optimized_model(manager) if manager is not None else None
        opsets = tuple(model.opset_import) if model is not None else ()
        training = TrainingGraph(graph, settings.recompute_level(), device, opsets)
        run_training_graph_passes(training)
        external_params.register_read_outside(training.external_params)
        if manager is not None:
            ort_internals.give_scalar_output_grads(manager, training.scalar_output_grads)
            # this model's earlier graph is gone: its plans go (the new graph's plans for the same PythonOps stay)
            previous = ort_internals.keep_for_fallback(manager, "buffer_plans", training.buffer_plans)
            if previous is not None:
                previous.forget()

    return classmethod(optimize_all)


def graph_built_by(original: Callable) -> Callable:
    """Wraps `TrainingManager._build_graph`: ORT's optimizer registry learns only the model's class name, so the
    manager building the graph is noted while it does, and the training-graph passes' results stay with its model."""

    @functools.wraps(original)
    def build_graph(self: Any, *args: Any, **kwargs: Any) -> Any:
        token = _BUILDING.set(self)
        try:
            return original(self, *args, **kwargs)
        finally:
            _BUILDING.reset(token)

    return build_graph


def zero3_memory_optimizer_off(original: Callable) -> Callable:
    """Wraps `TrainingManager._create_execution_agent`: for a ZeRO-3 graph, ORT's own memory optimizer stays off.

    It cannot recompute through the bridges and what it recomputes reads forward-gathered parameters; ort_zero's
    recompute pass has already applied the level (`ort_zero.ort.passes.recompute`). So ORT's probe of it, a second
    session built at the first step only to list what it could recompute, is not built either (it also fails on
    graphs whose symbolic dims sympy cannot parse)."""

    @functools.wraps(original)
    def _create_execution_agent(self: Any) -> None:
        level, plans = ort_internals.memory_optimizer_requested(self)
        model = ort_internals.optimized_model(self)
        if model is None or not is_zero3_graph(model.graph):
            original(self)
            return
        if level or plans:
            if level == 0:
                logger.warning(
                    "ort_zero: ORTMODULE_MEMORY_OPT_CONFIG plans are not applied to a ZeRO-3 model (they would read "
                    "parameters gathered in the forward); use ORTMODULE_MEMORY_OPT_LEVEL=1 for ort_zero's "
                    "layer-wise recompute"
                )
            ort_internals.turn_memory_optimizer_off(self)
        with ort_internals.memory_probe_skipped(self):
            original(self)

    return _create_execution_agent


def footprint_trimmed(original: Callable) -> Callable:
    """Wraps `TrainingManager._create_execution_agent`: once the session exists, what ORTModule keeps beyond its
    needs goes (`ort_zero.memory.footprint`: its graph builder, its graphs' dead protobuf memory, the export's
    heap), and on the CPU its autograd Function trims the heap after each backward. That change to the Function stays
    with the model when ort_zero is disabled."""

    @functools.wraps(original)
    def _create_execution_agent(self: Any) -> None:
        original(self)
        trim_training_manager(self)
        if ort_internals.device(self).type == "cpu":  # where the step's tensors live in glibc's heap
            trim_after_each_backward(self)

    return _create_execution_agent
