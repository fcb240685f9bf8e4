"""The element type of every value of an ONNX graph: what the graph declares, what ORT's PythonOps declare of their
outputs, and what ONNX's type inference adds, with ORT's own training ops (which ONNX does not know) followed
by hand."""

from __future__ import annotations

from collections.abc import Callable

import onnx
from onnx import TensorProto, helper

from ...python_op import PYTHON_OP, PYTHON_OP_GRAD, ints_attribute


def element_types(graph: onnx.GraphProto) -> dict[str, int]:
    """The element type of every value the graph declares (inputs, initializers, value_info, outputs, Constants)."""
    types = {value.name: value.type.tensor_type.elem_type for value in (*graph.input, *graph.value_info, *graph.output)}
    types.update({initializer.name: initializer.data_type for initializer in graph.initializer})
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            for attribute in node.attribute:
                if attribute.name == "value":
                    types[node.output[0]] = attribute.t.data_type
    return {name: elem_type for name, elem_type in types.items() if elem_type}


def value_types(
    graph: onnx.GraphProto,
    opsets: list[onnx.OperatorSetIdProto],
    copy_of: Callable[[str], str | None] = lambda name: None,
) -> dict[str, int]:
    """Every value's element type that can be known without running the graph (ORT's gradient graph declares few
    of its own values); `copy_of` names the value a value is a copy of (a recomputed one), which has its type. Reads
    the graph, changes nothing."""
    types = element_types(graph)
    outputs = [name for node in graph.node for name in node.output if name]
    for _ in range(4):  # ORT's ops feed ONNX's and the other way round; a few rounds reach every value
        if all(name in types for name in outputs):
            break  # every value is typed: no inference to run (a graph with ORT's symbolic shapes)
        known = len(types)
        types.update({name: types[original] for name in outputs if (original := copy_of(name)) in types})
        _add_ort_op_types(graph, types)
        types.update({k: v for k, v in _onnx_inferred(graph, opsets, types).items() if k not in types})
        if len(types) == known:
            break
    return types


# ORT's ops whose output has their first input's type (ONNX's inference does not know them): the MatMul gradients,
# and the Scale of ReduceMean's
_FIRST_INPUTS_TYPE = frozenset({"FusedMatMul", "TransposeMatMul", "Scale"})


def _add_ort_op_types(graph: onnx.GraphProto, types: dict[str, int]) -> None:
    for node in graph.node:
        if node.op_type == "SimplifiedLayerNormalization" and node.domain in ("", "ai.onnx"):  # ORT's, in ONNX's domain
            scale = types.get(node.input[1], types.get(node.input[0]))
            stash = next((a.i for a in node.attribute if a.name == "stash_type"), TensorProto.FLOAT)
            declared = [(node.output[0], scale), *((name, stash) for name in node.output[1:2])]
        elif node.domain != "com.microsoft":
            continue
        elif node.op_type in (PYTHON_OP, PYTHON_OP_GRAD):
            outputs = node.output[1:] if node.op_type == PYTHON_OP else node.output
            declared = zip(outputs, ints_attribute(node, "output_tensor_types"), strict=False)
        elif node.op_type in _FIRST_INPUTS_TYPE and node.input[0] in types:
            declared = [(node.output[0], types[node.input[0]])]
        elif node.op_type == "ConcatTraining" and node.input[0] in types:
            declared = [
                (node.output[0], types[node.input[0]]),
                *((name, TensorProto.INT64) for name in node.output[1:]),
            ]
        elif node.op_type == "YieldOp":
            skipped = set(ints_attribute(node, "non_differentiable_outputs"))
            differentiable = [name for index, name in enumerate(node.input) if index not in skipped]
            declared = [
                (out, types[name]) for out, name in zip(node.output, differentiable, strict=False) if name in types
            ]
        else:
            continue
        for name, elem_type in declared:
            if name and elem_type:
                types.setdefault(name, elem_type)


def _onnx_inferred(graph: onnx.GraphProto, opsets: list[onnx.OperatorSetIdProto], types: dict[str, int]) -> dict:
    declared = {value.name for value in (*graph.input, *graph.value_info, *graph.output)}
    copy = onnx.GraphProto()
    copy.CopyFrom(graph)
    copy.value_info.extend(helper.make_tensor_value_info(n, t, None) for n, t in types.items() if n not in declared)
    model = helper.make_model(copy, opset_imports=opsets)
    try:
        return element_types(onnx.shape_inference.infer_shapes(model).graph)
    except onnx.shape_inference.InferenceError:  # an op ONNX knows the schema of but not these inputs: none added
        return {}
