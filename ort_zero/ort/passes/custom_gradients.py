"""Export pass: a training graph has no node whose gradient ort_zero registered for attributes it does not have.

ORT finds a registered gradient by the node's op type alone (`ort_zero.ort.export.gradients`): a node that sets an
attribute its registered gradient assumes unset would train with a wrong gradient, silently. torch's exporter writes no
such
node today; one that appears stops the export here, named.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..export.gradients import set_attributes_assumed_unset
from .base import ExportedGraph, GraphPass
from .contract import Edit


@dataclass
class CheckedGradients:
    def log(self) -> None:
        pass


def run(exported: ExportedGraph) -> CheckedGradients:
    if exported.training:
        for node in exported.model.graph.node:
            if attributes := set_attributes_assumed_unset(node):
                raise RuntimeError(
                    f"ort_zero: {node.op_type} node {node.name!r} sets {', '.join(attributes)}, which the gradient "
                    "ort_zero registers with ORT for it does not handle (ort_zero/ort/export/gradients.py)"
                )
    return CheckedGradients()


PASS = GraphPass("custom_gradients", run, edits=frozenset({Edit.REWRITE}))
