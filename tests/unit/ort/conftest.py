"""What the ORT tests share: ort_zero's patches applied with ORTModule's silent fallback off, the check that a
model trains in ORT with PyTorch's loss and gradients (and really ran in ORT), and a model that puts one op on the
gradient's path."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator

import pytest
import torch

import ort_zero  # noqa: F401, I001  (before ORT: makes ORTModule importable on today's torch)
from ort_zero.ort.inspection import ort_run_record

TrainsAsPytorch = Callable[..., dict]


class Op(torch.nn.Module):
    """One op between two Linear layers, so that its gradient must flow back to trained weights (the loss in
    float32, so that a bf16 model's loss is not rounded again)."""

    def __init__(self, op: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.op = op
        self.inner, self.outer = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.outer(self.op(self.inner(x))).float().square().mean()


@pytest.fixture
def enabled(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("ORTMODULE_FALLBACK_POLICY", "FALLBACK_DISABLE")
    ort_zero.enable_zero3()
    yield
    ort_zero.disable_zero3()


def _train_once(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    loss = model(x)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


# bf16: where ORT computes in float32 what torch rounds to bf16 (a widened node), results part by a few of bf16's
# 8-bit-mantissa units; float32 keeps the parity tests' tolerance
TOLERANCES = {torch.float32: (1e-5, 1e-6, 1e-4, 1e-6), torch.bfloat16: (2e-2, 1e-3, 5e-2, 5e-3)}


@pytest.fixture
def trains_as_pytorch(enabled: None) -> TrainsAsPytorch:
    """`check(make_model, dtype=torch.float32)`: two models from `make_model` in `dtype` with the same weights, one
    trained a step in PyTorch and one in an ORTModule on the same (4, 8) batch: an ORT session ran, losses and
    gradients agree. Returns ORT's run record of the training graph (which PythonOps it ran)."""
    ortmodule = importlib.import_module("onnxruntime.training.ortmodule")

    def check(make_model: Callable[[], torch.nn.Module], dtype: torch.dtype = torch.float32) -> dict:
        torch.manual_seed(0)
        reference, model = make_model().to(dtype), make_model().to(dtype)
        model.load_state_dict(reference.state_dict())
        x = torch.randn(4, 8, dtype=dtype)
        loss_rtol, loss_atol, grad_rtol, grad_atol = TOLERANCES[dtype]
        expected_loss, expected_grads = _train_once(reference, x)
        in_ort = ortmodule.ORTModule(model)
        loss, grads = _train_once(in_ort, x)
        assert ort_run_record(in_ort)["training"]["session"], "no ORT session: the model did not run in ORT"
        torch.testing.assert_close(loss, expected_loss, rtol=loss_rtol, atol=loss_atol)
        for grad, expected in zip(grads, expected_grads, strict=True):
            torch.testing.assert_close(grad, expected, rtol=grad_rtol, atol=grad_atol)
        return ort_run_record(in_ort)["training"]

    return check
