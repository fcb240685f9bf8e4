"""How ort_zero's pass-through Functions return their tensors: views in PyTorch; under ORT, views that own nothing
where ORT's buffer plan owns the memory, copies where it plans a buffer of their own (`ort_zero.hooks.passthrough`).
"""

from __future__ import annotations

from typing import Any

import torch

from ort_zero.hooks import passthrough
from ort_zero.hooks.statistics import EndStep


class OrtContext:
    """What ORT passes as ctx in its unsafe mode: a plain object."""


def storage_owners(tensor: torch.Tensor) -> int:
    return torch._C._storage_Use_Count(tensor.untyped_storage()._cdata)


def forward(ctx: Any, key: int, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    passthrough.begin(ctx, key, *tensors)
    return passthrough.passed_through(ctx, EndStep, (key,), tensors)


def test_a_borrowed_view_reads_the_same_memory_without_owning_it() -> None:
    tensor = torch.arange(12.0).reshape(3, 4)[1:]
    owners = storage_owners(tensor)
    view = passthrough.borrowed(tensor)
    assert view.data_ptr() == tensor.data_ptr() and torch.equal(view, tensor)
    assert view.stride() == tensor.stride()
    assert storage_owners(tensor) == owners  # a detached view would be one more owner
    detached = tensor.detach()
    assert storage_owners(tensor) == owners + 1 and detached.data_ptr() == tensor.data_ptr()


def test_under_ort_outputs_are_borrowed_and_the_context_learns_which_inputs_want_gradients() -> None:
    wanted, plain = torch.ones(3, requires_grad=True), torch.zeros(2)
    ctx = OrtContext()
    outputs = forward(ctx, 7001, wanted, plain)
    assert ctx.needs_input_grad == (False, True, False)
    assert [o.data_ptr() for o in outputs] == [wanted.data_ptr(), plain.data_ptr()]
    assert all(storage_owners(o) == 1 for o in outputs)  # their own, unowning storages


def test_in_pytorch_outputs_are_views_that_keep_their_memory() -> None:
    tensor = torch.ones(3, requires_grad=True)

    class Through(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, key: int, t: torch.Tensor) -> torch.Tensor:
            return forward(ctx, key, t)[0]

        backward = staticmethod(passthrough.keyed_backward)

    output = Through.apply(7002, tensor)
    assert output.data_ptr() == tensor.data_ptr() and storage_owners(tensor) >= 2
    output.sum().backward()
    assert torch.equal(tensor.grad, torch.ones(3))


def test_a_pythonop_told_to_copy_returns_new_memory() -> None:
    passthrough.copy_outputs(passthrough.function_name(EndStep), (7003,))
    tensor = torch.ones(3)
    (copied,) = forward(OrtContext(), 7003, tensor)
    assert copied.data_ptr() != tensor.data_ptr() and torch.equal(copied, tensor)


def test_under_ort_gradients_are_borrowed_where_planned_copied_elsewhere_and_reshaped_when_stale() -> None:
    passthrough.borrow_grads(passthrough.function_name(EndStep), (7004,), frozenset({0}))
    inputs = (torch.ones(2, 3, requires_grad=True), torch.ones(4, requires_grad=True), torch.ones(5))
    ctx = OrtContext()
    forward(ctx, 7004, *inputs)
    # ORT makes zeros for a missing gradient shaped as at its first run: here a (7,) for the (4,) output
    grads = (torch.full((2, 3), 2.0), torch.zeros(7), torch.ones(5))
    borrowed, stale, unwanted = passthrough.input_grads(ctx, grads)
    assert borrowed.data_ptr() == grads[0].data_ptr() and storage_owners(grads[0]) == 1
    assert torch.equal(stale, torch.zeros(4))
    assert unwanted is None

    ctx = OrtContext()
    forward(ctx, 7004, *inputs)
    ort_grad = torch.full((4,), 3.0)
    _, copied, _ = passthrough.input_grads(ctx, (grads[0], ort_grad, grads[2]))
    assert copied.data_ptr() != ort_grad.data_ptr() and torch.equal(copied, ort_grad)
