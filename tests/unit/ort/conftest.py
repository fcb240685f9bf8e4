"""What the ORT tests share: ort_zero's patches applied with ORTModule's silent fallback off, and the check that a
model trains in ORT with PyTorch's loss and gradients (and really ran in ORT)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator

import pytest
import torch

import ort_zero  # noqa: F401, I001  (before ORT: makes ORTModule importable on today's torch)
from ort_zero.ort.inspection import ort_run_record

TrainsAsPytorch = Callable[[Callable[[], torch.nn.Module]], dict]


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


@pytest.fixture
def trains_as_pytorch(enabled: None) -> TrainsAsPytorch:
    """`check(make_model)`: two models from `make_model` with the same weights, one trained a step in PyTorch and
    one in an ORTModule on the same (4, 8) batch: an ORT session ran, losses and gradients agree. Returns ORT's run
    record of the training graph (which PythonOps it ran)."""
    ortmodule = importlib.import_module("onnxruntime.training.ortmodule")

    def check(make_model: Callable[[], torch.nn.Module]) -> dict:
        torch.manual_seed(0)
        reference, model = make_model(), make_model()
        model.load_state_dict(reference.state_dict())
        x = torch.randn(4, 8)
        expected_loss, expected_grads = _train_once(reference, x)
        in_ort = ortmodule.ORTModule(model)
        loss, grads = _train_once(in_ort, x)
        assert ort_run_record(in_ort)["training"]["session"], "no ORT session: the model did not run in ORT"
        torch.testing.assert_close(loss, expected_loss, rtol=1e-5, atol=1e-6)
        for grad, expected in zip(grads, expected_grads, strict=True):
            torch.testing.assert_close(grad, expected, rtol=1e-4, atol=1e-6)
        return ort_run_record(in_ort)["training"]

    return check
