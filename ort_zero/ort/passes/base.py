"""The one shape of ort_zero's graph passes: a name, what it needs and provides, one entry function, a report.

Two kinds of graph reach the passes: the forward graph ORTModule has just exported (`ExportedGraph`), and ORT's
complete forward+backward graph before its session exists (`TrainingGraph`). `pipeline.py` orders them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import onnx
import torch

from ...hooks.passthrough import BufferPlans, PythonOpKey
from ..graph.types import value_types
from .contract import Edit
from .recompute_region import RECOMPUTE_SUFFIX


class PassReport(Protocol):
    """What a pass did to one graph; it says so itself, on its pass's logger (nothing when it did nothing)."""

    def log(self) -> None: ...


@dataclass
class ExportedGraph:
    """What the export passes share: the exported forward graph, the module it was exported from, and the
    parameter inputs the passes took out of the graph (ORTModule's input bookkeeping follows them)."""

    model: onnx.ModelProto
    module: torch.nn.Module
    training: bool
    mem_efficient_grads: bool
    removed_inputs: list[str] = field(default_factory=list)
    mem_efficient_order: bool = False  # ORTModule should order the graph to free gradients early
    provided: set[str] = field(default_factory=set)


@dataclass
class YieldFeed:
    """What one pass-through PythonOp gives the YieldOp: its tensor inputs that are model outputs (`fed`) and those
    of them the YieldOp still reads from the PythonOp (`copied`: the PythonOp returns copies of them)."""

    fed: set[int] = field(default_factory=set)
    copied: set[int] = field(default_factory=set)


@dataclass
class TrainingGraph:
    """What the training-graph passes share: ORT's forward+backward graph, before its session exists."""

    graph: onnx.GraphProto
    recompute_level: int
    device: str = "cpu"  # the type of the device the session runs on ("cpu", "cuda")
    opsets: tuple[onnx.OperatorSetIdProto, ...] = ()  # the model's opset imports
    provided: set[str] = field(default_factory=set)
    # how ORT plans the pass-through PythonOps' memory here (passthrough_buffers); the model's ORTModule keeps it
    buffer_plans: BufferPlans = field(default_factory=BufferPlans)
    # model outputs whose missing gradient ORT now takes as a scalar zero (scalar_output_grads)
    scalar_output_grads: list[int] = field(default_factory=list)
    # by pass-through PythonOp, the model outputs the YieldOp reads from it (yield_from_makers)
    yield_feeds: dict[PythonOpKey, YieldFeed] = field(default_factory=dict)
    # parameters to register with DeepSpeed as a module's external ones before the session runs (backward_gather)
    external_params: list[tuple[torch.nn.Module, torch.nn.Parameter]] = field(default_factory=list)
    # the element type of every value, worked out once, by the first pass that asks (`element_types`)
    types: dict[str, int] = field(default_factory=dict)

    def element_types(self) -> dict[str, int]:
        """Every value's element type (`graph.types.value_types`; a recomputed copy has its original's); a pass that
        adds values adds theirs."""
        if not self.types:
            copy_of = lambda name: name.removesuffix(RECOMPUTE_SUFFIX)  # noqa: E731
            self.types = value_types(self.graph, list(self.opsets), copy_of=copy_of)
        return self.types


@dataclass(frozen=True)
class GraphPass:
    """A pass: `run` edits the graph in place, only as `edits` declares (`contract`), and returns its report; `needs`
    must be provided by earlier passes."""

    name: str
    run: Callable[[Any], PassReport]
    edits: frozenset[Edit]
    needs: frozenset[str] = frozenset()
    provides: frozenset[str] = frozenset()
