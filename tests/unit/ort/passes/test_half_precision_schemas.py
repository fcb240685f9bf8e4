"""The half_precision_schemas pass: a bf16 op ORT's schemas or gradient definitions do not take (a MoE router's TopK,
XLNet's EyeLike, any Div) trains in ORT with PyTorch's bf16 values, computing in float32 between Casts; without the
pass ORT refuses the graph, and ort_zero says so in one line naming the op. float16 ops and float32 models are left
alone."""

from __future__ import annotations

import importlib
import io
from collections.abc import Callable

import onnx
import pytest
import torch

import ort_zero  # noqa: F401  (before ORT: makes ORTModule importable on today's torch)
from ort_zero.ort.passes import half_precision_schemas, pipeline
from ort_zero.ort.passes.base import ExportedGraph

from ..conftest import Op

ortmodule = importlib.import_module("onnxruntime.training.ortmodule")


CASES = {  # the op ORT refuses in bf16, and a model computing it
    "TopK": lambda x: x.topk(2, dim=-1).values.repeat(1, 4),  # a router's top-k scores
    "EyeLike": lambda x: torch.eye(x.size(0), dtype=x.dtype) @ x,  # of a dynamic size, as XLNet's
    "Div": lambda x: x / (x.abs() + 1.0) + x / x.norm(dim=-1, keepdim=True),  # same shape and broadcast
}


@pytest.mark.parametrize("op", CASES)
def test_a_bf16_op_ort_cannot_build_trains_in_float32_between_casts(trains_as_pytorch: Callable, op: str) -> None:
    record = trains_as_pytorch(lambda: Op(CASES[op]), dtype=torch.bfloat16)
    assert record["float32_fallbacks"].get(op, 0) >= 1


@pytest.mark.parametrize("op", CASES)
def test_without_the_pass_ort_refuses_the_bf16_graph(enabled: None, op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    passes = tuple(p for p in pipeline.EXPORT_PASSES if p is not half_precision_schemas.PASS)
    monkeypatch.setattr(pipeline, "EXPORT_PASSES", passes)
    model = ortmodule.ORTModule(Op(CASES[op]).to(torch.bfloat16))
    with pytest.raises(Exception, match=f"ort_zero: ONNX Runtime cannot build .*{op}.* in bfloat16") as refused:
        model(torch.randn(4, 8, dtype=torch.bfloat16)).backward()
    assert "\n" not in str(refused.value)  # ORT's type error, named in one line


def _exported(op: str, dtype: torch.dtype) -> ExportedGraph:
    buffer = io.BytesIO()
    model = Op(CASES[op]).to(dtype)
    torch.onnx.export(model, (torch.randn(4, 8, dtype=dtype),), buffer, opset_version=17, dynamo=False)
    return ExportedGraph(onnx.load_from_string(buffer.getvalue()), model, training=True, mem_efficient_grads=False)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("op", CASES)
def test_only_bf16_nodes_are_widened(op: str, dtype: torch.dtype) -> None:
    """float16 has these schemas and gradients in ORT; a float32 graph is not read."""
    exported = _exported(op, dtype)
    before = [node.op_type for node in exported.model.graph.node]
    report = half_precision_schemas.run(exported)
    after = [node.op_type for node in exported.model.graph.node]
    if dtype == torch.bfloat16:
        assert report.widened[op] >= 1 and after.count("Cast") > before.count("Cast")
    else:
        assert not report.widened and after == before
