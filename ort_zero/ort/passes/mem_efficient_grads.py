"""Post-export pass: memory-efficient gradients for parameters that are ordinary graph inputs.

Without it ORT keeps every parameter gradient until its backward ends and returns them all at once. After it, each
trainable parameter `P` still a graph input (non-ZeRO training; ZeRO-3 parameters already come from bridges) is
produced inside the graph by its own `ParamRetrieval` PythonOp, fed by the shared trigger input. The node's output
keeps `P`'s name, so no consumer changes. Its backward runs as soon as ORT has `P`'s gradient and calls
`P.backward(grad)`: AccumulateGrad and every hook on `P` (DeepSpeed's reduce hooks, the user's) fire during ORT's
backward, and ORT can free the gradient at once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import onnx
import torch
from onnx import helper

from ...python_op import function_name, make_python_op, onnx_dtype
from ..graph.edit import register_function
from ..step.functions import RETRIEVED_PARAMS, ParamRetrieval
from .base import ExportedGraph, GraphPass
from .contract import Edit
from .zero3_params import TRIGGER_NAME

logger = logging.getLogger(__name__)


@dataclass
class RetrievedParams:
    """The parameters that now reach ORT through their own `ParamRetrieval`."""

    retrieved: list[str]

    def log(self) -> None:
        if self.retrieved:
            logger.info("ort_zero: memory-efficient gradients for %d parameters", len(self.retrieved))


def run(exported: ExportedGraph) -> RetrievedParams:
    """The pass's entry: for a training export with memory-efficient gradients on, rewrite the parameter inputs."""
    if not (exported.training and exported.mem_efficient_grads):
        return RetrievedParams([])
    named = dict(exported.module.named_parameters())
    retrieved = rewrite_param_inputs(exported.model, named, list(named))
    if retrieved:
        register_function(ParamRetrieval)
        exported.mem_efficient_order = True
    exported.removed_inputs += retrieved
    return RetrievedParams(retrieved)


# After zero3_params: ZeRO-3 parameters have left the inputs by then, and the trigger input is shared.
PASS = GraphPass(
    "mem_efficient_grads",
    run,
    edits=frozenset({Edit.INSERT}),
    needs=frozenset({"zero3_params_from_bridges"}),
)


def rewrite_param_inputs(
    model: onnx.ModelProto, named_params: dict[str, torch.nn.Parameter], param_names: list[str]
) -> list[str]:
    """Apply the pass in place to every trainable parameter that is a graph input; return their names."""
    graph = model.graph
    chosen = [i for i in graph.input if i.name in named_params and named_params[i.name].requires_grad]
    if not chosen:
        return []
    if not any(i.name == TRIGGER_NAME for i in graph.input):
        first_param = next((k for k, g in enumerate(graph.input) if g.name in set(param_names)), len(graph.input))
        graph.input.insert(first_param, helper.make_tensor_value_info(TRIGGER_NAME, onnx.TensorProto.FLOAT, [1]))
    for offset, graph_input in enumerate(chosen):
        param = named_params[graph_input.name]
        RETRIEVED_PARAMS.add(param, key=id(param))
        node = make_python_op(
            function_name(ParamRetrieval),
            f"ort_zero_retrieval_{offset}",
            int_scalars=[id(param)],
            inputs=[(TRIGGER_NAME, 1, onnx.TensorProto.FLOAT)],
            outputs=[(graph_input.name, param.dim(), onnx_dtype(param.dtype))],
        )
        graph.node.insert(offset, node)
    names = [i.name for i in chosen]
    for graph_input in chosen:
        graph.input.remove(graph_input)
    return names
