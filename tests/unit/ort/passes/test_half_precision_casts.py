"""The half_precision_casts pass: a bf16 graph of ops ORT's CPU provider has no bf16 kernel for runs after the pass
(and is refused without it), with torch's bf16 results; ops with bf16 kernels stay bf16; an op with no kernel in
any precision is one error naming the op and the node; ORT's own gradient ops (Scale, FusedMatMul), which ONNX's
type inference does not know, are typed and compute in float32 too."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import onnx
import onnxruntime
import pytest
import torch
from onnx import TensorProto, helper

import ort_zero  # noqa: F401  (before ORT: makes ORTModule importable on today's torch)
from ort_zero.ort.graph.widening import widened_record
from ort_zero.ort.passes.half_precision_casts import UnsupportedOpError, widen_unsupported

from ..conftest import Op

BF16, FLOAT = TensorProto.BFLOAT16, TensorProto.FLOAT
OPSETS = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]


def _gated_sum(dtype: int = BF16) -> onnx.ModelProto:
    """y = (x + r) * sigmoid(x) reshaped, in `dtype` between float32 inputs and output: Add, Sigmoid and Mul have
    no bf16 CPU kernel, Cast and Reshape have."""
    nodes = [
        helper.make_node("Cast", ["x32"], ["x"], name="cast_x", to=dtype),
        helper.make_node("Cast", ["r32"], ["r"], name="cast_r", to=dtype),
        helper.make_node("Add", ["x", "r"], ["s"], name="add"),
        helper.make_node("Sigmoid", ["x"], ["g"], name="sigmoid"),
        helper.make_node("Mul", ["s", "g"], ["m"], name="mul"),
        helper.make_node("Reshape", ["m", "shape"], ["y"], name="reshape"),
        helper.make_node("Cast", ["y"], ["y32"], name="cast_y", to=FLOAT),
    ]
    graph = helper.make_graph(
        nodes,
        "bf16",
        [helper.make_tensor_value_info(name, FLOAT, [2, 8]) for name in ("x32", "r32")],
        [helper.make_tensor_value_info("y32", FLOAT, [16])],
        [helper.make_tensor("shape", TensorProto.INT64, [1], [16])],
        value_info=[helper.make_tensor_value_info(name, dtype, None) for name in ("x", "r", "s", "g", "m", "y")],
    )
    return helper.make_model(graph, opset_imports=OPSETS, ir_version=9)  # ORT 1.19.2 reads IR up to 10


def _session(model: onnx.ModelProto) -> onnxruntime.InferenceSession:
    return onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_without_the_pass_the_cpu_provider_refuses_the_graph() -> None:
    with pytest.raises(Exception, match="NOT_IMPLEMENTED"):
        _session(_gated_sum())


def test_the_graph_runs_in_bf16_with_torchs_bf16_results() -> None:
    model = _gated_sum()
    report = widen_unsupported(model.graph, "cpu", OPSETS)
    assert dict(report.widened) == {"Add": 1, "Sigmoid": 1, "Mul": 1}
    assert widened_record(model.graph) == {"Add": 1, "Mul": 1, "Sigmoid": 1}
    reshape = next(node for node in model.graph.node if node.op_type == "Reshape")
    assert reshape.input[0] == "m" and reshape.output[0] == "y"  # has a bf16 kernel: stays bf16
    x, r = torch.randn(2, 8), torch.randn(2, 8)
    (got,) = _session(model).run(None, {"x32": x.numpy(), "r32": r.numpy()})
    x, r = x.bfloat16(), r.bfloat16()
    expected = ((x + r) * torch.sigmoid(x)).reshape(16)  # torch's bf16 kernels: float32 inside, rounded per op
    assert torch.equal(torch.from_numpy(got), expected.float())


def test_a_float32_graph_is_left_alone() -> None:
    model = _gated_sum(FLOAT)
    before = model.SerializeToString()
    assert not widen_unsupported(model.graph, "cpu", OPSETS).widened
    assert model.SerializeToString() == before


def test_an_op_without_any_cpu_kernel_is_one_error_naming_it() -> None:
    node = helper.make_node(
        "BiasDropout", ["x", "b"], ["y", "mask"], name="layers.3/mlp/BiasDropout", domain="com.microsoft"
    )
    graph = helper.make_graph(
        [node],
        "no_kernel",
        [helper.make_tensor_value_info(name, BF16, [2, 8]) for name in ("x", "b")],
        [
            helper.make_tensor_value_info("y", BF16, [2, 8]),
            helper.make_tensor_value_info("mask", TensorProto.BOOL, [2, 8]),
        ],
    )
    with pytest.raises(UnsupportedOpError) as raised:
        widen_unsupported(graph, "cpu", OPSETS)
    message = str(raised.value)
    assert "\n" not in message
    assert "BiasDropout" in message and "layers.3/mlp/BiasDropout" in message and "bfloat16" in message
    assert "float32" in message  # the way out


SESSION_GRAPH = Path(__file__).parent / "scripts" / "bf16_session_graph.py"


def test_the_session_keeps_no_float32_copy_from_the_forward_for_the_backward() -> None:
    """A bf16 ZeRO-3 Gemma in ORT (one rank, fallback off): each backward node widens its own bf16 inputs, so no
    float32 copy lives from the forward to the backward in the graph ORT's session runs. ORT's common-subexpression
    elimination merged those Casts into the forward's (+370 MiB per rank at 162M, seq 1024): its sessions of such
    graphs run without it."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(SESSION_GRAPH)], env=env, capture_output=True, text=True, timeout=300, check=True
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["ort_ran"] and result["dtype"] == "torch.bfloat16", result
    assert math.isfinite(result["loss"]), result
    assert result["widened"].get("SimplifiedLayerNormalizationGrad"), result  # the backward widens its inputs
    assert result["kept"] == [], result


def own_ops_of_ort(hidden: torch.Tensor) -> torch.Tensor:
    """A mean and a batched product of two activations: their gradients are ORT's own ops (Scale, FusedMatMul),
    which ONNX's type inference does not know."""
    centred = hidden - hidden.mean(-1, keepdim=True)
    return (centred.view(4, 2, 4) @ hidden.view(4, 4, 2)).reshape(4, 4).repeat(1, 2)


def test_orts_own_gradient_ops_of_a_bf16_graph_compute_in_float32(trains_as_pytorch: Callable) -> None:
    record = trains_as_pytorch(lambda: Op(own_ops_of_ort), dtype=torch.bfloat16)
    assert {"Scale", "FusedMatMul"} <= set(record["float32_fallbacks"]), record["float32_fallbacks"]
