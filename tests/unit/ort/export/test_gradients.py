"""ort_zero's gradients for ops ORT 1.19.2 cannot differentiate: a model using the op trains in ORT with PyTorch's
values and gradients; without ort_zero's registration ORT cannot build the model's gradient graph."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import onnx
import pytest
import torch
from onnx import helper

import ort_zero  # noqa: E402, F401, I001  (before ORT: makes ORTModule importable on today's torch)
from ort_zero.ort.export import gradients
from ort_zero.ort.passes import custom_gradients
from ort_zero.ort.passes.base import ExportedGraph

from ..conftest import Op

CASES = {"CumSum": lambda x: x.cumsum(-1) + x.reshape(2, 2, 8).cumsum(1).reshape(4, 8)}


def test_every_gradient_is_tested_here() -> None:
    assert {gradient.domain_and_op()[1] for gradient in gradients.GRADIENTS} == set(CASES)


@pytest.mark.parametrize("op", CASES)
def test_op_trains_in_ort_as_pytorch(trains_as_pytorch: Callable[..., None], op: str) -> None:
    trains_as_pytorch(lambda: Op(CASES[op]))


_WITHOUT = """
import os, torch, ort_zero
from ort_zero import patches
from onnxruntime.training.ortmodule import ORTModule
from onnxruntime.training.ortmodule._custom_gradient_registry import CustomGradientRegistry

class Op(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.inner(x).cumsum(-1)

os.environ["ORTMODULE_FALLBACK_POLICY"] = "FALLBACK_DISABLE"
ort_zero.enable_zero3()
CustomGradientRegistry.register_all = patches.original("ort.custom_gradients")  # ORT's gradients only
try:
    ORTModule(Op())(torch.randn(4, 8)).sum().backward()
except Exception as error:
    print("FAILED:", error)
"""


def test_without_the_gradient_ort_cannot_train_it() -> None:
    """In a fresh process: ORT's C++ registry keeps a gradient definition once it is registered."""
    child = subprocess.run([sys.executable, "-c", _WITHOUT], capture_output=True, text=True, timeout=300)
    assert "FAILED:" in child.stdout, child.stdout[-2000:] + child.stderr[-2000:]
    assert "CumSum" in child.stdout


def _cumsum_graph(**attributes: int) -> onnx.ModelProto:
    node = helper.make_node("CumSum", ["x", "axis"], ["y"], name="cumsum", **attributes)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4]), helper.make_tensor_value_info("axis", 6, [])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4])],
    )
    return helper.make_model(graph)


@pytest.mark.parametrize("attribute", ["exclusive", "reverse"])
def test_a_cumsum_the_gradient_does_not_handle_stops_the_export(attribute: str) -> None:
    exported = ExportedGraph(
        _cumsum_graph(**{attribute: 1}), torch.nn.Module(), training=True, mem_efficient_grads=False
    )
    with pytest.raises(RuntimeError, match=attribute):
        custom_gradients.run(exported)


def test_torchs_cumsum_passes_the_check() -> None:
    exported = ExportedGraph(_cumsum_graph(), torch.nn.Module(), training=True, mem_efficient_grads=False)
    custom_gradients.run(exported)
