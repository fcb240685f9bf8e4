"""Training-graph pass: layer-wise recompute for ZeRO-3 models in ORT (ORTMODULE_MEMORY_OPT_LEVEL 1 and 2).

ORT's own memory optimizer cannot serve a ZeRO-3 graph: every module boundary is a bridge PythonOp, which it does not
recompute through (it finds no transformer layer), and what it does recompute reads the parameters gathered in the
forward, keeping them alive until the backward. This pass does on ORT's forward+backward graph what per-layer
gradient checkpointing does in PyTorch:

- a *region* is a transformer layer (a child of a ModuleList or Sequential of like modules); at level 2 also each
  other module of the model outside the layers whose parent is the model or holds layers;
- backward reads of values computed inside a region (activations the forward would keep) are rewired to copies of
  the region's forward nodes, computed in the backward from the region's inputs;
- the copies start at the region's anchor (the gradient node of its PostForwardBridge, where the backward enters
  it) through a RecomputeStartBridge; each module inside gathers its parameters again just before its copied ops
  (RecomputeParamsBridge), so no copy reads a parameter gathered in the forward;
- every Dropout gets a fixed seed, so its copy draws the forward's mask; random ops, foreign PythonOps and ops
  with subgraphs are not recomputed (their outputs stay kept).
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import onnx
import torch
from onnx import helper

from ...python_op import PYTHON_OP, function_name, function_name_of
from ...zero3 import state as zero3_state
from ...zero3.ort_bridges import RecomputeParamsBridge, RecomputeStartBridge
from ...zero3.subscriber import stacked_layers
from ..graph.edit import is_zero3_graph, register_function
from ..graph.training_graph import TrainingGraphView
from .base import GraphPass, TrainingGraph
from .contract import Edit
from .recompute_region import RECOMPUTE_SUFFIX, ForwardBridges, Region

logger = logging.getLogger(__name__)

LAYER_PLAN = "TransformerLayerRecompute"
MODULE_PLAN = "ModuleRecompute"
_DROPOUTS = frozenset({"Dropout", "BitmaskDropout", "BiasDropout", "BitmaskBiasDropout"})


@dataclass
class RecomputeReport:
    """What the pass did to one training graph."""

    level: int = 0
    regions: dict[str, str] = field(default_factory=dict)  # module path -> plan
    recomputed_nodes: int = 0
    rewired_reads: int = 0
    kept: list[str] = field(default_factory=list)  # values read by the backward that stay kept, and why

    def log(self) -> None:
        if self.regions:
            logger.info(
                "ort_zero: ORTMODULE_MEMORY_OPT_LEVEL=%d: %d regions recomputed in the backward (%s; %d nodes, "
                "%d reads rewired), their parameters gathered again for the recompute",
                self.level,
                len(self.regions),
                ", ".join(self.regions),
                self.recomputed_nodes,
                self.rewired_reads,
            )
        elif self.level:
            logger.warning(
                "ort_zero: ORTMODULE_MEMORY_OPT_LEVEL=%d but nothing was recomputed: the model has no layers "
                "(children of a ModuleList/Sequential of like modules) whose backward reads their activations",
                self.level,
            )
        if self.kept:
            logger.warning(
                "ort_zero: recompute keeps %d values from the forward to the backward: %s",
                len(self.kept),
                "; ".join(self.kept[:5]),
            )


def run(training: TrainingGraph) -> RecomputeReport:
    """The pass's entry (see `recompute_regions`)."""
    return recompute_regions(training.graph, training.recompute_level)


# After backward_gather: a recomputed region's reads of parameters are those the re-gather left.
PASS = GraphPass(
    "recompute",
    run,
    edits=frozenset({Edit.INSERT, Edit.REWIRE, Edit.REWRITE}),
    needs=frozenset({"backward_regathers"}),
    provides=frozenset({"recomputed_regions"}),
)


def recompute_regions(graph: onnx.GraphProto, level: int) -> RecomputeReport:
    """Apply the pass in place at `level` (0 does nothing) to a training graph of ort_zero's bridges."""
    report = RecomputeReport(level=level)
    if not is_zero3_graph(graph):
        return report
    seed_dropouts(graph)
    if level == 0:
        return report
    view = TrainingGraphView(graph)
    bridges = ForwardBridges(view)
    new_nodes: list[onnx.NodeProto] = []
    for path, key, plan in _regions(bridges.root_module(), bridges.keys, level):
        region = Region(view, bridges, key, path, plan)
        if region.skip_reason:
            report.kept.append(f"{path}: {region.skip_reason}")
            continue
        rewired = region.rewire(new_nodes)
        if rewired:
            report.regions[path] = plan
            report.rewired_reads += rewired
        report.kept.extend(region.kept)
    if new_nodes:
        report.recomputed_nodes = sum(1 for node in new_nodes if node.name.endswith(RECOMPUTE_SUFFIX))
        view.rebuild(new_nodes)
        register_function(RecomputeStartBridge)
        register_function(RecomputeParamsBridge)
    return report


def seed_dropouts(graph: onnx.GraphProto) -> None:
    """Give every Dropout a fixed seed (from torch's seed and the node): a recomputed copy then draws the forward's
    mask, and runs at any level draw the same masks (each node keeps its own generator, advanced once per step)."""
    for node in graph.node:
        if node.op_type in _DROPOUTS and not any(a.name == "seed" for a in node.attribute):
            seed = (zlib.crc32(node.output[0].encode()) ^ torch.initial_seed()) & 0x7FFFFFFF
            node.attribute.append(helper.make_attribute("seed", seed))


def recompute_record(graph: onnx.GraphProto | None) -> dict:
    """Evidence read back from a training graph: the recomputed regions, plans applied and nodes recomputed."""
    nodes = list(graph.node) if graph is not None else []
    starts = [node for node in nodes if function_name_of(node) == function_name(RecomputeStartBridge)]
    plans: dict[str, int] = {}
    layers, level = [], 0
    for node in starts:
        plan, _, path = node.doc_string.partition(" ")
        plans[plan] = plans.get(plan, 0) + 1
        level = max(level, 2 if plan == MODULE_PLAN else 1)
        layers.append(path)
    copies = [node for node in nodes if node.name.endswith(RECOMPUTE_SUFFIX)]
    return {
        "level": level,
        "layers": layers,
        "plans": plans,
        "recomputed_nodes": len(copies),
        # torch kernels (attention, experts) run again in the backward, per kernel: how many copies
        "recomputed_python_ops": _counts(function_name_of(node) for node in copies if node.op_type == PYTHON_OP),
    }


def _counts(names: Iterator[str | None]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name in names:
        counts[name or ""] = counts.get(name or "", 0) + 1
    return counts


def _regions(root: torch.nn.Module, keys: set[int], level: int) -> Iterator[tuple[str, int, str]]:
    """(module path, key, plan) of the regions to recompute, in module order."""
    key_of = {id(zero3_state.lookup(key).module): key for key in keys}
    layers = {id(layer) for layer in stacked_layers(root)}
    holds_layer = {id(m) for m in root.modules() if any(id(sub) in layers for sub in m.modules())}
    for path, module in root.named_modules():
        if id(module) in layers and id(module) in key_of:
            yield path, key_of[id(module)], LAYER_PLAN
    if level < 2:
        return
    for parent_path, parent in root.named_modules():
        if parent is not root and (id(parent) not in holds_layer or id(parent) in layers):
            continue
        for name, child in parent.named_children():
            if id(child) not in holds_layer and id(child) in key_of:
                yield f"{parent_path}.{name}".lstrip("."), key_of[id(child)], MODULE_PLAN
