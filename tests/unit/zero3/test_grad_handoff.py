"""How a gradient ORT computed reaches DeepSpeed: stored as it is where AccumulateGrad would only store it, never
left pointing into ORT's memory after the hand-over, and everything else exactly as `param.backward(grad)` does."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from ort_zero.distributed import shut_down_distributed
from ort_zero.foreign import deepspeed as ds_internals
from ort_zero.zero3.grad_handoff import hand_over


def seen_by_hook(param: nn.Parameter, *, release: bool) -> list[int]:
    """Registers a hook like DeepSpeed's; it records where `param.grad` lives and, with `release`, lets go of it."""
    seen: list[int] = []

    def hook(p: nn.Parameter) -> None:
        seen.append(p.grad.untyped_storage().data_ptr())
        if release:
            p.grad = None

    param.register_post_accumulate_grad_hook(hook)
    return seen


def test_the_hooks_see_the_gradient_itself() -> None:
    """No copy: AccumulateGrad (`param.backward`) would hand the hooks a copy of a gradient someone else holds."""
    param = nn.Parameter(torch.randn(64, 32))
    seen = seen_by_hook(param, release=True)
    grad = torch.randn(64, 32)

    hand_over(param, grad)

    assert seen == [grad.untyped_storage().data_ptr()]
    assert param.grad is None


def test_a_gradient_the_hooks_keep_is_copied_out_of_the_handed_memory() -> None:
    """ORT reuses its buffer once the PythonOp returns: what stays in `param.grad` must not live there."""
    param = nn.Parameter(torch.randn(64, 32))
    seen_by_hook(param, release=False)
    grad = torch.randn(64, 32)
    expected = grad.clone()

    hand_over(param, grad)
    grad.zero_()  # ORT writes the next value into its buffer

    assert torch.equal(param.grad, expected)


def test_without_hooks_it_accumulates_like_autograd() -> None:
    param = nn.Parameter(torch.randn(8))
    grad = torch.randn(8)
    hand_over(param, grad)
    hand_over(param, grad)
    assert torch.equal(param.grad, 2 * grad)
    assert param.grad.untyped_storage().data_ptr() != grad.untyped_storage().data_ptr()


@pytest.mark.parametrize("case", ["existing_grad", "tensor_hook", "non_contiguous"])
def test_anything_autograd_would_do_more_goes_through_autograd(case: str) -> None:
    param = nn.Parameter(torch.randn(16, 16))
    seen = seen_by_hook(param, release=False)
    grad = torch.randn(16, 16)
    expected = grad.clone()
    if case == "existing_grad":
        param.grad = torch.ones(16, 16)
        expected += 1
    elif case == "tensor_hook":
        param.register_hook(lambda g: g * 3)
        expected *= 3
    else:
        grad = torch.randn(16, 16).t()
        expected = grad.clone()

    hand_over(param, grad)

    assert torch.equal(param.grad, expected)
    assert len(seen) == 1


@pytest.fixture
def single_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A one-rank process group for a real ZeRO-3 engine; what the engine changes in torch is put back after."""
    for name, value in {"LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(torch.nn.functional, "linear", torch.nn.functional.linear)  # ZeRO-3 swaps it globally
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    shut_down_distributed()


def zero3_engine(bucket: int) -> Any:
    import deepspeed

    model = nn.Sequential(nn.Linear(16, 16, bias=False), nn.Linear(16, 256, bias=False))
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": {"stage": 3, "contiguous_gradients": True, "reduce_bucket_size": bucket},
    }
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    return engine


def test_deepspeed_reduces_a_gradient_too_big_for_its_bucket_before_the_hand_over_ends(single_rank: None) -> None:
    """A gradient larger than ZeRO-3's reduce bucket stays in `param.grad` until the next one arrives; the hand-over
    reduces it at once instead, to the same partition `param.backward(grad)` gives, and without a copy."""
    engine = zero3_engine(bucket=300)  # the 16x256 weight does not fit: DeepSpeed keeps its gradient
    params = list(engine.module.parameters())
    assert ds_internals.stage3_optimizer_behind(params[1]) is engine.optimizer
    grads = [torch.randn(p.ds_shape) for p in params]

    def partitions(handing: Any) -> list[torch.Tensor]:
        engine.optimizer.zero_grad()
        for param in params:
            param.all_gather()
        for param, grad in zip(params, grads, strict=True):
            handing(param, grad.clone())
        engine.optimizer.independent_gradient_partition_epilogue()
        return [g.clone() for g in engine.optimizer.averaged_gradients[0]]

    through_autograd = partitions(lambda param, grad: param.backward(grad))
    in_handed_memory: list[bool] = []

    def hand_over_and_look(param: nn.Parameter, grad: torch.Tensor) -> None:
        handed_memory = grad.untyped_storage().data_ptr()
        hand_over(param, grad)
        in_handed_memory.append(param.grad is not None and param.grad.untyped_storage().data_ptr() == handed_memory)

    handed = partitions(hand_over_and_look)

    # the small gradient was copied into the bucket, the big one reduced and released
    assert in_handed_memory == [False, False], "a gradient still lives in the memory it was handed in"
    assert params[1].grad is None
    for expected, got in zip(through_autograd, handed, strict=True):
        torch.testing.assert_close(got, expected)
    engine.destroy()
