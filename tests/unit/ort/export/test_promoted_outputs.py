"""torch's exporter types an op mixing a bool and a bf16 tensor (RecurrentGemma's `reset + ~reset * multiplier`) as
complex128 and fails at the next op: while ORTModule exports a ZeRO-3 model the output is bfloat16, the graph gets
the Casts its bool operands need, and the model trains in ORT with PyTorch's values."""

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

importlib.import_module("onnxruntime.training.ortmodule")  # before the patches: applying them needs ORT imported


def reset_gated(x: torch.Tensor) -> torch.Tensor:
    reset = x > 0
    return reset + ~reset * x  # bool + bool * bf16, as RecurrentGemma's recurrent layer mixes them


def _export(patched: bool) -> onnx.GraphProto:
    buffer = io.BytesIO()
    with patches.applied("ort_export") if patched else contextlib.nullcontext():
        model, x = Op(reset_gated).to(torch.bfloat16), torch.randn(4, 8, dtype=torch.bfloat16)
        torch.onnx.export(model, (x,), buffer, dynamo=False)
    return onnx.load_from_string(buffer.getvalue()).graph


def test_the_bool_operands_are_cast_to_bfloat16() -> None:
    graph = _export(True)
    casts = [a.i for n in graph.node if n.op_type == "Cast" for a in n.attribute if a.name == "to"]
    assert casts.count(TensorProto.BFLOAT16) == 2 and TensorProto.COMPLEX128 not in casts, casts  # reset, ~reset


def test_without_the_patch_torch_cannot_export_it() -> None:
    with pytest.raises(RuntimeError, match="ComplexDouble is an unexpected tensor scalar type"):
        _export(False)


def test_a_bf16_model_mixing_bool_and_bf16_trains_in_ort(trains_as_pytorch: Callable) -> None:
    with patches.applied("ort_export"):
        trains_as_pytorch(lambda: Op(reset_gated), dtype=torch.bfloat16)
