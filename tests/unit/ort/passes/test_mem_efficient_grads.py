"""Memory-efficient gradients without DeepSpeed: same numbers, hooks once, and hooks *during* ORT's backward."""

from __future__ import annotations

import copy
import importlib
import os
from collections.abc import Callable, Iterator

import pytest
import torch

os.environ["ORTMODULE_FALLBACK_POLICY"] = "FALLBACK_DISABLE"

import ort_zero  # noqa: E402, F401, I001  (before ORT: makes ORTModule importable on today's torch)

ortmodule = importlib.import_module("onnxruntime.training.ortmodule")

from ort_zero.ort.step.functions import ParamRetrieval  # noqa: E402
from ort_zero.python_op import function_name, function_name_of  # noqa: E402

EVENTS: list[str] = []


class Marker(torch.autograd.Function):
    """A PythonOp in the ORT graph that records when ORT runs its backward."""

    @staticmethod
    def forward(ctx, label: int, x: torch.Tensor) -> torch.Tensor:
        ctx.label = label
        return x.detach()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[None, torch.Tensor]:
        EVENTS.append(f"op{ctx.label}")
        return None, grad


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(4))
        self.frozen = torch.nn.Linear(16, 16)
        self.frozen.requires_grad_(False)
        self.head = torch.nn.Linear(16, 16, bias=False)
        self.head.weight = self.layers[0].weight  # tied

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for index, layer in enumerate(self.layers):
            x = Marker.apply(index, torch.tanh(layer(x)))
        return self.head(self.frozen(x)).square().mean()


def train_steps(
    model: torch.nn.Module, steps: int = 3, after_backward: Callable[[int], None] = lambda step: None
) -> tuple[list[float], list[dict[str, torch.Tensor]]]:
    losses, grads = [], []
    for step in range(steps):
        model.zero_grad(set_to_none=True)
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(step))
        loss = model(x)
        loss.backward()
        after_backward(step)
        losses.append(loss.item())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    return losses, grads


@pytest.fixture
def mem_efficient() -> Iterator[None]:
    ort_zero.enable_mem_efficient_grads(True)
    yield
    ort_zero.enable_mem_efficient_grads(False)


def hooked(model: torch.nn.Module) -> dict[str, list[torch.Tensor]]:
    seen: dict[str, list[torch.Tensor]] = {}
    for name, param in model.named_parameters():
        if param.requires_grad:
            seen[name] = []
            param.register_hook(lambda g, name=name: (seen[name].append(g.clone()), EVENTS.append(name))[0])
    return seen


def test_same_losses_and_gradients_hooks_once_and_during_backward(mem_efficient: None) -> None:
    torch.manual_seed(0)
    reference = Net()
    model = ortmodule.ORTModule(copy.deepcopy(reference))
    seen = hooked(model)
    ref_losses, ref_grads = train_steps(reference)
    EVENTS.clear()

    def one_hook_call_per_parameter(step: int) -> None:
        for name, grads_seen in seen.items():
            assert len(grads_seen) == step + 1, f"hook on {name}: {len(grads_seen)} calls after {step + 1} backwards"
            # the tied weight too: one call with the sum of both uses' gradients
            torch.testing.assert_close(grads_seen[step], ref_grads[step][name], rtol=1e-6, atol=1e-7)

    losses, grads = train_steps(model, after_backward=one_hook_call_per_parameter)

    manager = model._torch_module._execution_manager(True)
    assert manager._execution_agent is not None, "no ORT session ran"
    graph = manager._onnx_models.optimized_model.graph
    assert any(function_name_of(n) == function_name(ParamRetrieval) for n in graph.node), "the pass did not run in ORT"
    assert losses == pytest.approx(ref_losses, rel=1e-6, abs=1e-7)
    for expected, got in zip(ref_grads, grads, strict=True):
        assert set(got) == set(expected)
        for name in expected:
            torch.testing.assert_close(got[name], expected[name], rtol=1e-6, atol=1e-7)
    last_step = EVENTS[len(EVENTS) * 2 // 3 :]
    first_param = min(i for i, e in enumerate(last_step) if not e.startswith("op"))
    last_op = max(i for i, e in enumerate(last_step) if e.startswith("op"))
    assert first_param < last_op, f"parameter hooks all fired after ORT's backward: {last_step}"


def test_without_the_pass_hooks_fire_after_ort_backward() -> None:
    """The control: ORT returns all gradients at the end, so the evidence above can fail."""
    torch.manual_seed(0)
    model = ortmodule.ORTModule(Net())
    hooked(model)
    EVENTS.clear()
    train_steps(model, steps=1)
    ops = [i for i, e in enumerate(EVENTS) if e.startswith("op")]
    params = [i for i, e in enumerate(EVENTS) if not e.startswith("op")]
    assert ops and params and max(ops) < min(params)


def test_ort_environment_switch_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    """ORT's own ORTMODULE_ENABLE_MEM_EFFICIENT_GRAD_MGMT=1 (broken in ORT 1.19.2) runs ort_zero's pass instead."""
    monkeypatch.setenv("ORTMODULE_ENABLE_MEM_EFFICIENT_GRAD_MGMT", "1")
    ort_zero.enable_zero3()
    try:
        torch.manual_seed(0)
        reference = Net()
        model = ortmodule.ORTModule(copy.deepcopy(reference))
        ref_losses, ref_grads = train_steps(reference, steps=1)
        losses, grads = train_steps(model, steps=1)
    finally:
        ort_zero.disable_zero3()
    manager = model._torch_module._execution_manager(True)
    assert manager._execution_agent is not None, "no ORT session ran"
    assert any(
        function_name_of(n) == function_name(ParamRetrieval) for n in manager._onnx_models.optimized_model.graph.node
    )
    assert losses == pytest.approx(ref_losses, rel=1e-6, abs=1e-7)
    for name, expected in ref_grads[0].items():
        torch.testing.assert_close(grads[0][name], expected, rtol=1e-6, atol=1e-7)
