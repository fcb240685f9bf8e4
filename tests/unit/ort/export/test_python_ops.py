"""Torch ops that run in PyTorch from inside the ORT graph (ort_zero/ort/export/python_ops.py, the Functions in
ort_zero/ort/step/python_ops.py): each Function gives torch's values and gradients; a module calling the op, exported
while the patch group is applied, trains in ORT (fallback disabled) with a PythonOp for it and PyTorch's values;
exported without the group, ORT cannot train it."""

from __future__ import annotations

import importlib
from collections.abc import Callable

import pytest
import torch

import ort_zero  # noqa: F401, I001  (before ORT: makes ORTModule importable on today's torch)
from ort_zero import patches
from ort_zero.hooks.export_mode import exporting
from ort_zero.ort.export import python_ops as export_python_ops
from ort_zero.ort.inspection import ort_run_record
from ort_zero.ort.step.python_ops import Exponential, ScatterReduce, SolveTriangular, Uniform
from ort_zero.python_op import function_name

ortmodule = importlib.import_module("onnxruntime.training.ortmodule")
GROUP = "export_python_ops"


def solve(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Qwen3.5's call: a unit lower-triangular system, several right-hand sides, batched."""
    system = (x @ x.transpose(-1, -2)).tril(-1)
    return torch.linalg.solve_triangular(system, y, upper=False, unitriangular=True)


def gumbel_pick(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """PhiMoE's router: Gumbel noise from Tensor.exponential_ picks one column per row."""
    noise = torch.empty_like(x).exponential_().log()
    picked = (x - noise).max(dim=-1)[1].unsqueeze(-1)
    return x.softmax(-1).gather(-1, picked) * y


def patch_maxima(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """BLT's patch embeddings: each patch's maximum over its positions (scatter_reduce amax without the destination's
    values; patch 3 has no position and keeps its 0), read back at each position."""
    patch_ids = (torch.arange(x.shape[1]) // 2)[None, :, None].expand_as(x)
    patches = x.new_zeros(x.shape[0], 4, x.shape[2]).scatter_reduce(1, patch_ids, x, "amax", include_self=False)
    return patches.gather(1, patch_ids) * y + patches[:, 3:].expand_as(y)


def jittered(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """PhiMoE's router: a mask drawn with torch.rand_like."""
    return torch.where(torch.rand_like(x) > 0.75, x, y)


def shaken(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """PhiMoE's input jitter: x scaled by empty_like(x).uniform_(1 - eps, 1 + eps)."""
    return x * torch.empty_like(x).uniform_(0.9, 1.1) + y


CASES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "torch.linalg_solve_triangular_in_torch": solve,
    "torch.tensor_scatter_reduce_in_torch": patch_maxima,
    "torch.tensor_exponential_in_torch": gumbel_pick,
    "torch.tensor_uniform_in_torch": shaken,
    "torch.rand_like_in_torch": jittered,
}
FUNCTIONS = {
    "torch.linalg_solve_triangular_in_torch": SolveTriangular,
    "torch.tensor_scatter_reduce_in_torch": ScatterReduce,
    "torch.tensor_exponential_in_torch": Exponential,
    "torch.tensor_uniform_in_torch": Uniform,
    "torch.rand_like_in_torch": Uniform,
}


class Op(torch.nn.Module):
    """The op between Linear layers, so that its gradient must reach trained weights."""

    def __init__(self, op: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.op = op
        self.first, self.second, self.out = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.op(self.first(x), self.second(x))).square().mean()


def test_every_python_op_is_tested_here() -> None:
    assert {op.name for op in export_python_ops.PYTHON_OPS} == set(CASES) == set(FUNCTIONS)


@pytest.mark.parametrize(("upper", "left", "unitriangular"), [(False, True, True), (True, False, False)])
def test_solve_triangular_gives_torch_values_and_gradients(upper: bool, left: bool, unitriangular: bool) -> None:
    torch.manual_seed(0)
    a = (torch.randn(2, 5, 5) + 4 * torch.eye(5)).requires_grad_()
    b = torch.randn(2, 5, 3) if left else torch.randn(2, 3, 5)
    b.requires_grad_()
    expected = torch.linalg.solve_triangular(a, b, upper=upper, left=left, unitriangular=unitriangular)
    got = SolveTriangular.apply(a, b, upper, left, unitriangular)
    assert torch.equal(got, expected)
    grad = torch.randn_like(expected)
    got_grads, expected_grads = torch.autograd.grad(got, (a, b), grad), torch.autograd.grad(expected, (a, b), grad)
    assert all(torch.equal(g, e) for g, e in zip(got_grads, expected_grads, strict=True))


def test_exponential_draws_what_torch_draws_and_the_trace_draws_nothing() -> None:
    x = torch.empty(3, 4)
    torch.manual_seed(1)
    expected = torch.empty_like(x).exponential_(2.0)
    torch.manual_seed(1)
    with exporting():
        Exponential.apply(x, 2.0)
    assert torch.equal(Exponential.apply(x, 2.0), expected)


def train(model: torch.nn.Module, x: torch.Tensor, steps: int = 2) -> list[torch.Tensor]:
    """Losses and the gradients of `steps` forward/backward passes from one seed (no optimizer: the gradients are
    compared instead)."""
    torch.manual_seed(5)
    results = []
    for _ in range(steps):
        loss = model(x)
        loss.backward()
        results += [loss.detach(), *(p.grad.clone() for p in model.parameters())]
    return results


@pytest.mark.parametrize("name", CASES)
def test_the_op_trains_in_ort_as_in_pytorch(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORTMODULE_FALLBACK_POLICY", "FALLBACK_DISABLE")
    torch.manual_seed(0)
    reference, model = Op(CASES[name]), Op(CASES[name])
    model.load_state_dict(reference.state_dict())
    x = torch.randn(2, 6, 8)
    expected = train(reference, x)
    in_ort = ortmodule.ORTModule(model)
    with patches.applied(GROUP):  # ORTModule exports at the first forward
        in_ort(x)
    model.zero_grad()
    got = train(in_ort, x)
    record = ort_run_record(in_ort)["training"]
    assert record["session"], "no ORT session"
    assert function_name(FUNCTIONS[name]) in record["python_ops"], record
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", CASES)
def test_without_the_python_op_ort_cannot_train_it(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORTMODULE_FALLBACK_POLICY", "FALLBACK_DISABLE")
    model = ortmodule.ORTModule(Op(CASES[name]))
    if name == "torch.rand_like_in_torch":  # torch exports it (RandomUniformLike): ORT draws other numbers
        reference = Op(CASES[name])
        reference.load_state_dict(model._torch_module._flattened_module._original_module.state_dict())
        assert not torch.equal(train(model, torch.randn(2, 6, 8))[0], train(reference, torch.randn(2, 6, 8))[0])
        return
    with pytest.raises(Exception, match="solve_triangular|exponential|uniform|include_self"):  # noqa: PT011 - ORT wraps it
        train(model, torch.randn(2, 6, 8), steps=1)
