"""Training-graph pass: the PythonOps whose outputs leave the forward return copies, not views.

ORT's allocation planner ignores a node's alias map when the node's first consumer is the YieldOp (onnxruntime
1.19.2, `FindReusableInput`): it plans the node's outputs as buffers of their own. ORT's own view ops then copy
into them, but a pass-through PythonOp (the outermost PostForwardBridge, EndStep) returns views of its inputs all
the same. With memory reuse on, ORT then hands the viewed buffer on while the model's output still lives in it:
measured, the final LayerNorm's bias gradient was summed from a buffer the backward had already overwritten.
Here such nodes lose their forward alias map and their Functions return copies (`hooks.passthrough.return_copies`);
the copy costs one buffer per model output. Backward maps are kept: gradients arriving through the YieldOp are
planned as the external buffers they are.
"""

from __future__ import annotations

import onnx

from ..hooks import passthrough
from .graph import func_name, ints_attribute, set_ints_attribute

_REUSE = "tensor_reuse_map"


def copy_forward_outputs(graph: onnx.GraphProto) -> list[str]:
    """Make the ort_zero PythonOps that feed the YieldOp (directly or through Identity) return copies; their names."""
    producer = {value: node for node in graph.node for value in node.output}
    changed: dict[str, onnx.NodeProto] = {}
    for value in (value for node in graph.node if node.op_type == "YieldOp" for value in node.input):
        node = producer.get(value)
        while node is not None and node.op_type == "Identity":
            node = producer.get(node.input[0])
        name = func_name(node) if node is not None else None
        if name is None or not name.startswith("ort_zero.") or not any(i >= 0 for i in ints_attribute(node, _REUSE)):
            continue
        set_ints_attribute(node, _REUSE, [-1] * len(ints_attribute(node, _REUSE)))
        passthrough.return_copies(name, tuple(ints_attribute(node, "input_int_scalars")))
        changed[node.name] = node
    return list(changed)
