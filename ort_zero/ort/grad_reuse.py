"""Training-graph pass: the backward of ort_zero's pass-through PythonOps hands ORT its gradient buffers back.

Bridges and recorders return their inputs as views (their forward alias maps say so) and, in backward, return each
output's gradient as the input's gradient, the same tensor. Only the gradient graph knows which output gradients
exist (ORT feeds none where an output is off the gradient path; the Function then returns new zeros), so the
gradient nodes' reuse maps are set here, where that is known. Without it ORT copies every such gradient, at every
module boundary ("... A clone will be done before returning to ORT").
"""

from __future__ import annotations

import onnx

from .graph import func_name, ints_attribute, set_ints_attribute

_OWN_FUNCTIONS = "ort_zero."
_REUSE = "tensor_reuse_map"


def declare_passthrough_grad_reuse(graph: onnx.GraphProto) -> int:
    """Set the reuse maps of ort_zero's pass-through gradient nodes; return how many gradients now reuse."""
    forward_reuse = {
        node.output[0]: ints_attribute(node, _REUSE)
        for node in graph.node
        if node.op_type == "PythonOp" and (func_name(node) or "").startswith(_OWN_FUNCTIONS)
    }
    reused = 0
    for node in graph.node:
        if node.op_type != "PythonOpGrad" or not node.input or node.input[0] not in forward_reuse:
            continue
        # Forward output o (0 is ctx) is a view of tensor input forward_map[o]; its gradient is this node's input o,
        # and this node's output t is tensor input t's gradient.
        forward_map = forward_reuse[node.input[0]]
        backward_map = [-1] * len(node.output)
        for output, tensor_input in enumerate(forward_map):
            if output > 0 and tensor_input >= 0 and output < len(node.input) and node.input[output]:
                if tensor_input < len(backward_map) and node.output[tensor_input]:
                    backward_map[tensor_input] = output
        set_ints_attribute(node, _REUSE, backward_map)
        reused += sum(1 for index in backward_map if index >= 0)
    return reused
