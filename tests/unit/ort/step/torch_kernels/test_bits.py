"""Bit equality on the kernels' hot path (ort_zero/ort/step/torch_kernels/bits.py): 64-bit words where the bytes
divide into them, element bits elsewhere, the same answers either way; and the causal-mask check built on it."""

from __future__ import annotations

import pytest
import torch

from ort_zero.ort.step.torch_kernels.attention import is_causal_mask
from ort_zero.ort.step.torch_kernels.bits import same_bits


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.bool, torch.int64])
@pytest.mark.parametrize("numel", [64, 3])
def test_a_copy_has_the_same_bits_and_one_changed_element_does_not(dtype: torch.dtype, numel: int) -> None:
    tensor = (torch.arange(numel) % 2).to(dtype)
    assert same_bits(tensor, tensor.clone())
    changed = tensor.clone()
    changed[-1] = 1 - tensor[-1].to(torch.int64).item()
    assert not same_bits(tensor, changed)


def test_signed_zeros_differ_and_a_nan_is_itself() -> None:
    zeros = torch.zeros(16, dtype=torch.bfloat16)
    assert not same_bits(zeros, -zeros)
    nans = torch.full((16,), float("nan"), dtype=torch.bfloat16)
    assert same_bits(nans, nans.clone())


def test_views_that_are_not_whole_words_compare_by_element() -> None:
    base = torch.arange(130, dtype=torch.int16).to(torch.bfloat16)
    assert same_bits(base[1:65], base.clone()[1:65])
    assert not same_bits(base[1:65], base[2:66])
    square = torch.arange(64.0).reshape(8, 8).bfloat16()
    assert same_bits(square.t(), square.t().contiguous()) and not same_bits(square.t(), square)


def test_another_shape_dtype_or_device_is_not_the_same() -> None:
    tensor = torch.zeros(8)
    assert not same_bits(tensor, torch.zeros(2, 4))
    assert not same_bits(tensor, torch.zeros(8, dtype=torch.float64))
    assert not same_bits(tensor, torch.zeros(8, device="meta"))


def _causal(batch: int, seq: int) -> torch.Tensor:
    return torch.ones(seq, seq, dtype=torch.bool).tril().expand(batch, 1, seq, seq).clone()


@pytest.mark.parametrize("batch", [1, 3])
def test_a_causal_mask_is_found_in_every_batch_row_and_one_changed_row_is_not(batch: int) -> None:
    mask = _causal(batch, 24)
    assert is_causal_mask(mask, 24, 24)
    mask[-1, 0, 5, 20] = True
    assert not is_causal_mask(mask, 24, 24)


def test_an_expanded_mask_is_checked_as_it_is() -> None:
    causal = torch.ones(24, 24, dtype=torch.bool).tril()
    assert is_causal_mask(causal.expand(2, 1, 24, 24), 24, 24)
    assert not is_causal_mask(causal.t().expand(2, 1, 24, 24), 24, 24)


def test_a_trace_records_no_view_to_another_dtype() -> None:
    """The exporter traces the kernels' forwards and has no ONNX op for a dtype's view: under a trace the check
    compares the tensors as they are."""
    seen: list[bool] = []

    def check(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        seen.append(same_bits(a, b))
        return a + b

    tensor = torch.arange(64.0).bfloat16()
    graph = torch.jit.trace(check, (tensor, tensor.clone()), check_trace=False).graph
    assert seen == [True]
    assert not [node for node in graph.nodes() if node.kind() == "aten::view"]
