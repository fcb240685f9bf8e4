"""torch's exporter writes a promotion to bfloat16 (a bf16 tensor times an int64 mask, as Mamba's mixer computes) as
Cast(to=15), complex128 in ONNX: while ORTModule exports a ZeRO-3 model the Cast gets ONNX's bfloat16, and the model
trains in ORT with PyTorch's values; without the patch ORT refuses the graph."""

from __future__ import annotations

import contextlib
import importlib
import io
from collections.abc import Callable

import onnx
import pytest
import torch
from onnx import TensorProto

import ort_zero  # noqa: F401  (before ORT: makes ORTModule importable on today's torch)
from ort_zero import patches

from ..conftest import Op

ortmodule = importlib.import_module("onnxruntime.training.ortmodule")


def masked(x: torch.Tensor) -> torch.Tensor:
    return x * (x > 0).long()  # the tracer sees bf16 x int64: the analysis inserts the promotion's Cast


def _promotion_cast(patched: bool, dtype: torch.dtype) -> int:
    """The type the promotion's Cast (the one after the Cast that makes the mask int64) casts the mask to."""
    buffer = io.BytesIO()
    with patches.applied("ort_export") if patched else contextlib.nullcontext():
        torch.onnx.export(Op(masked).to(dtype), (torch.randn(4, 8, dtype=dtype),), buffer, dynamo=False)
    graph = onnx.load_from_string(buffer.getvalue()).graph
    casts = [a.i for n in graph.node if n.op_type == "Cast" for a in n.attribute if a.name == "to"]
    return casts[casts.index(TensorProto.INT64) + 1]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_the_promotion_casts_to_the_onnx_number_of_the_dtype(dtype: torch.dtype) -> None:
    number = {torch.bfloat16: TensorProto.BFLOAT16, torch.float16: TensorProto.FLOAT16, torch.float32: 1}[dtype]
    assert _promotion_cast(True, dtype) == number
    if dtype == torch.bfloat16:  # what torch writes: its own number for bfloat16
        assert _promotion_cast(False, dtype) == TensorProto.COMPLEX128


def test_a_bf16_model_promoting_an_int64_mask_trains_in_ort(trains_as_pytorch: Callable) -> None:
    with patches.applied("ort_export"):
        trains_as_pytorch(lambda: Op(masked), dtype=torch.bfloat16)


def test_without_the_patch_ort_refuses_the_graph(enabled: None) -> None:
    model = ortmodule.ORTModule(Op(masked).to(torch.bfloat16))
    with pytest.raises(Exception, match="complex128"):
        model(torch.randn(4, 8, dtype=torch.bfloat16)).backward()
