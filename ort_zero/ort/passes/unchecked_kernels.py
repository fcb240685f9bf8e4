"""Export pass: ORT runs the torch-kernel PythonOps (`ort_zero.ort.step.torch_kernels`) without its safety copies.

By default (`safe_run_mode` 1) ORT runs a PythonOp through torch's autograd and, at its first run, copies every
tensor input to learn which the Function saves or changes in place, copying those again at every later run. The
kernels change no input, return no input, save nothing with `save_for_backward` (they keep their own copies), so the
checks find nothing, but the first run's copies are garbage the size of every kernel input: on a 162M LLaMA at seq
1024 the first forward's peak held 1.2 GiB more per rank than later forwards'. With `safe_run_mode` 0 ORT calls the
Function's forward and backward directly with a plain context (the kernels read which inputs want a gradient from the
tensors then: `torch_kernels.context.wanted_grads`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import onnx

from ...python_op import function_name_of
from ..step.torch_kernels import UNCHECKED
from .base import ExportedGraph, GraphPass
from .contract import Edit

logger = logging.getLogger(__name__)
_SAFE_RUN_MODE = "safe_run_mode"


@dataclass
class UncheckedKernels:
    nodes: list[str]

    def log(self) -> None:
        if self.nodes:
            logger.info("ort_zero: %d torch-kernel PythonOps run without ORT's input copies", len(self.nodes))


def unchecked(node: onnx.NodeProto) -> None:
    for attribute in [a for a in node.attribute if a.name == _SAFE_RUN_MODE]:
        node.attribute.remove(attribute)
    node.attribute.append(onnx.helper.make_attribute(_SAFE_RUN_MODE, 0))


def run(exported: ExportedGraph) -> UncheckedKernels:
    kernels = [node for node in exported.model.graph.node if function_name_of(node) in UNCHECKED]
    for node in kernels:
        unchecked(node)
    return UncheckedKernels([node.name for node in kernels])


PASS = GraphPass("unchecked_kernels", run, edits=frozenset({Edit.REWRITE}))
