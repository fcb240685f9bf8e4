"""ort_run_record: what an ORTModule really ran, per mode, and nothing for a model that never ran in ORT."""

from __future__ import annotations

import importlib

import pytest
import torch

import ort_zero  # noqa: E402, F401, I001  (before ORT: makes ORTModule importable on today's torch)

ortmodule = importlib.import_module("onnxruntime.training.ortmodule")

from ort_zero import patches  # noqa: E402
from ort_zero.ort.inspection import ort_run_record  # noqa: E402
from ort_zero.python_op import function_name  # noqa: E402


class Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad * 2


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return Double.apply(self.linear(x)).sum()


def test_record_names_the_sessions_and_python_ops_that_ran() -> None:
    model = ortmodule.ORTModule(Net())
    before = ort_run_record(model)
    assert before["training"] == {
        "session": False,
        "providers": [],
        "cpu_mem_arena": None,
        "python_ops": [],
        "float32_fallbacks": {},
        "backward_reads_of_forward_gathers": [],
        "recompute": {"level": 0, "layers": [], "plans": {}, "recomputed_nodes": 0, "recomputed_python_ops": {}},
    }

    model(torch.randn(2, 4)).backward()
    record = ort_run_record(model)
    assert record["training"] == {
        "session": True,
        "providers": ["CPUExecutionProvider"],
        "cpu_mem_arena": True,  # kept: nothing is recomputed
        "python_ops": [function_name(Double)],
        "float32_fallbacks": {},
        "backward_reads_of_forward_gathers": [],
        "recompute": {"level": 0, "layers": [], "plans": {}, "recomputed_nodes": 0, "recomputed_python_ops": {}},
    }
    assert record["inference"] == {
        "session": False,
        "providers": [],
        "cpu_mem_arena": None,
        "python_ops": [],
        "float32_fallbacks": {},
    }

    with torch.no_grad():
        model(torch.randn(2, 4))
    assert ort_run_record(model)["inference"] == {
        "session": True,
        "providers": ["CPUExecutionProvider"],
        "cpu_mem_arena": True,
        "python_ops": [function_name(Double)],
        "float32_fallbacks": {},
    }


def test_a_bf16_model_on_the_cpu_records_the_ops_that_ran_in_float32() -> None:
    """ORT's CPU provider has no bf16 kernel for the linear layer's Gemm/MatMul nor its gradient's ops: both graphs
    say which nodes computed in float32 instead; the model's output stays bf16."""
    with patches.applied("ort"):  # enable_zero3()'s ORTModule patches: the passes run
        _train_and_evaluate_in_bf16()


def _train_and_evaluate_in_bf16() -> None:
    model = ortmodule.ORTModule(Net().bfloat16())
    x = torch.randn(2, 4, dtype=torch.bfloat16)
    loss = model(x)
    assert loss.dtype == torch.bfloat16
    loss.backward()
    with torch.no_grad():
        model(x)
    record = ort_run_record(model)
    for mode in ("training", "inference"):
        assert record[mode]["session"], mode
        assert record[mode]["float32_fallbacks"], record[mode]
        assert "Cast" not in record[mode]["float32_fallbacks"]


def test_a_plain_module_is_refused() -> None:
    with pytest.raises(TypeError, match="not an ORTModule"):
        ort_run_record(Net())
