"""Which ops an ORT execution provider can run with given element types: asked of ORT itself, one node at a time.

ORT 1.19.2's training build does not list its kernels in Python, and its CPU provider registers few ops for bfloat16
and float16 (Cast and the data-movement ops; no arithmetic), while its CUDA provider has most. So the answer comes
from the provider: a one-node model of the op, with the node's attributes and element types, given to a session with
every graph optimization off; ORT refuses it (NOT_IMPLEMENTED) exactly when no kernel matches. Answers are kept per
op signature for the life of the process.
"""

from __future__ import annotations

import functools

import onnx
from onnx import helper

from ...python_op import PYTHON_OP, PYTHON_OP_GRAD

# ORT's own nodes that the probe cannot rebuild alone (their kernels take any element type)
_NOT_PROBED = frozenset({PYTHON_OP, PYTHON_OP_GRAD, "YieldOp"})
# Kernels registered for every element type that refuse 16-bit floats only when they run; the probe builds, never
# runs. ORT 1.19.2's CPU Split ("Split operator does not support BFloat16 yet", LLaMA's rotary gradient) and SliceGrad
# ("Type for T or Tind not supported yet", TRL's SFT loss).
_REFUSED_WHEN_RUN = {"CPUExecutionProvider": frozenset({"Split", "SplitTraining", "SliceGrad"})}
_HALF = frozenset({onnx.TensorProto.BFLOAT16, onnx.TensorProto.FLOAT16})


@functools.cache
def _has_kernel(provider: str, signature: bytes) -> bool:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    try:
        onnxruntime.InferenceSession(signature, options, providers=[provider])
    except Exception as error:  # ORT raises its own exception types, by status code
        return "NOT_IMPLEMENTED" not in str(error)
    return True


def has_kernel(
    node: onnx.NodeProto, types: dict[str, int], opsets: list[onnx.OperatorSetIdProto], provider: str
) -> bool:
    """Whether `provider` has a kernel for `node` with the element types `types` gives its inputs and outputs.

    A node whose types are not all known, or that the probe cannot rebuild, is taken as runnable: ORT itself then
    decides, at session creation."""
    if node.op_type in _REFUSED_WHEN_RUN.get(provider, ()):
        return not any(types.get(name) in _HALF for name in (*node.input, *node.output))
    if node.op_type in _NOT_PROBED or any(
        a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute
    ):
        return True
    inputs = list(dict.fromkeys(name for name in node.input if name))
    if any(name not in types for name in (*inputs, *(name for name in node.output if name))):
        return True
    probe = helper.make_node(
        node.op_type,
        [f"i{inputs.index(name)}" if name else "" for name in node.input],
        [f"o{j}" if name else "" for j, name in enumerate(node.output)],
        "probe",
        domain=node.domain,
    )
    probe.attribute.extend(node.attribute)
    graph = helper.make_graph(
        [probe],
        "kernel_probe",
        [helper.make_tensor_value_info(f"i{j}", types[name], None) for j, name in enumerate(inputs)],
        [helper.make_tensor_value_info(f"o{j}", types[name], None) for j, name in enumerate(node.output) if name],
    )
    model = helper.make_model(graph, opset_imports=list(opsets))
    model.ir_version = min(model.ir_version, 9)  # ORT 1.19.2 reads IR up to 10
    return _has_kernel(provider, model.SerializeToString(deterministic=True))
