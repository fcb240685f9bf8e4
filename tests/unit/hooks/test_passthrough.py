"""How ort_zero's pass-through Functions return their tensors: views in PyTorch; under ORT's plan of a training
graph, views that own nothing where ORT's buffers own the memory, copies where ORT plans a buffer of their own
(`ort_zero.hooks.passthrough`).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from ort_zero.hooks import exporting, passthrough
from ort_zero.hooks.statistics import EndStep

NAME = passthrough.function_name(EndStep)


class Through(torch.autograd.Function):
    """EndStep's pass-through part, without its subscriber."""

    @staticmethod
    def forward(ctx: Any, key: int, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return passthrough.passed_through(ctx, EndStep, (key,), tensors)

    backward = staticmethod(passthrough.keyed_backward)


@pytest.fixture
def plans() -> Iterator[passthrough.BufferPlans]:
    """One training graph's plans, forgotten after the test."""
    made = passthrough.BufferPlans()
    yield made
    made.forget()


def _use_count(tensor: torch.Tensor) -> int:
    return torch._C._storage_Use_Count(tensor.untyped_storage()._cdata)


def storage_owners(tensor: torch.Tensor) -> int:
    """Tensors owning `tensor`'s memory (torch >= 2.13 counts the Python storage object that reading it makes)."""
    return _use_count(tensor) - (_use_count(torch.empty(1)) - 1)


def test_a_borrowed_view_reads_the_same_memory_without_owning_it() -> None:
    tensor = torch.arange(12.0).reshape(3, 4)[1:]
    owners = storage_owners(tensor)
    view = passthrough.borrowed(tensor)
    assert view.data_ptr() == tensor.data_ptr() and torch.equal(view, tensor)
    assert view.stride() == tensor.stride()
    assert storage_owners(tensor) == owners  # a detached view would be one more owner
    detached = tensor.detach()
    assert storage_owners(tensor) == owners + 1 and detached.data_ptr() == tensor.data_ptr()


def test_without_a_plan_outputs_are_views_that_keep_their_memory_and_gradients_pass_as_they_are() -> None:
    tensor = torch.ones(3, requires_grad=True)
    (output,) = Through.apply(7001, tensor)
    assert output.data_ptr() == tensor.data_ptr() and storage_owners(tensor) >= 2
    grad = torch.full((3,), 2.0)
    output.backward(grad)
    assert torch.equal(tensor.grad, grad)


def test_planned_outputs_are_borrowed_or_copied(plans: passthrough.BufferPlans) -> None:
    plans.plan(NAME, (7002,), copied=frozenset(), borrowed_grads=frozenset())
    plans.plan(NAME, (7003,), copied=frozenset({0}), borrowed_grads=frozenset())
    tensor = torch.ones(3)
    (borrowed,) = Through.apply(7002, tensor)
    (copied,) = Through.apply(7003, tensor)
    assert borrowed.data_ptr() == tensor.data_ptr() and storage_owners(borrowed) == 1
    assert copied.data_ptr() != tensor.data_ptr() and torch.equal(copied, tensor)


def test_planned_gradients_are_borrowed_where_ort_planned_them_copied_elsewhere_zeros_where_missing(
    plans: passthrough.BufferPlans,
) -> None:
    plans.plan(NAME, (7004,), copied=frozenset(), borrowed_grads=frozenset({0}))
    inputs = (torch.ones(2, requires_grad=True), torch.ones(4, requires_grad=True), torch.ones(5, requires_grad=True))
    outputs = Through.apply(7004, *inputs)
    seen: list[torch.Tensor] = []
    for tensor in inputs:
        tensor.register_hook(lambda grad: seen.append(grad) or grad)
    grads = (torch.full((2,), 2.0), torch.full((4,), 3.0))
    torch.autograd.backward(outputs[:2], grads)  # output 2 gets no gradient
    # hooks fire in the order autograd runs them: collect by shape
    by_size = {grad.numel(): grad for grad in seen}
    assert by_size[2].data_ptr() == grads[0].data_ptr() and storage_owners(by_size[2]) == 1
    assert by_size[4].data_ptr() != grads[1].data_ptr() and torch.equal(by_size[4], grads[1])
    assert torch.equal(by_size[5], torch.zeros(5))


def test_forgetting_a_graphs_plans_brings_pytorchs_views_back_for_its_python_ops_only() -> None:
    """A model that falls back forgets its own graph's plans; another model's, and a newer graph's plan for the
    same PythonOp (the model was exported again), stay."""
    falling_back, other, older, newer = (passthrough.BufferPlans() for _ in range(4))
    falling_back.plan(NAME, (7005,), copied=frozenset(), borrowed_grads=frozenset())
    other.plan(NAME, (7007,), copied=frozenset(), borrowed_grads=frozenset())
    older.plan(NAME, (7008,), copied=frozenset({0}), borrowed_grads=frozenset())
    newer.plan(NAME, (7008,), copied=frozenset(), borrowed_grads=frozenset())
    falling_back.forget()
    older.forget()
    tensor = torch.ones(3)
    try:
        (viewed,) = Through.apply(7005, tensor)
        assert storage_owners(tensor) >= 2 and viewed.data_ptr() == tensor.data_ptr()
        del viewed
        for key in (7007, 7008):
            (borrowed,) = Through.apply(key, tensor)
            assert borrowed.data_ptr() == tensor.data_ptr() and storage_owners(borrowed) == 1
    finally:
        other.forget()
        newer.forget()


def test_a_models_plans_go_with_the_model() -> None:
    """The plans live as long as their model keeps them (its ORTModule), not as long as the process: a model that is
    gone leaves no plan behind for a later model whose PythonOp has the same key."""
    plans = passthrough.BufferPlans()
    plans.plan(NAME, (7009,), copied=frozenset(), borrowed_grads=frozenset())
    tensor = torch.ones(3)
    (borrowed,) = Through.apply(7009, tensor)
    assert storage_owners(borrowed) == 1
    del plans, borrowed
    gc.collect()
    (viewed,) = Through.apply(7009, tensor)
    assert storage_owners(tensor) >= 2 and viewed.data_ptr() == tensor.data_ptr(), "a gone model's plan was followed"


def test_a_forward_run_for_an_export_never_borrows(plans: passthrough.BufferPlans) -> None:
    """The inference graph's export runs the bridges in PyTorch after ORT planned them for training: a borrowed view
    of a tensor that PyTorch frees would read freed memory (falcon corrupted the heap that way)."""
    plans.plan(NAME, (7006,), copied=frozenset(), borrowed_grads=frozenset({0}))
    tensor = torch.ones(3, requires_grad=True)
    owners = storage_owners(tensor)
    with exporting():
        (output,) = Through.apply(7006, tensor)
    assert output.data_ptr() == tensor.data_ptr() and storage_owners(tensor) == owners + 1
    grad = torch.full((3,), 2.0)
    output.backward(grad)
    assert torch.equal(tensor.grad, grad)
