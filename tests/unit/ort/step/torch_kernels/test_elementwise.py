"""A 16-bit SiLU, products and sums of activations as torch's kernels in ORT's graph (ort_zero/ort/step/torch_kernels/
elementwise.py): the Functions' values and gradients are torch's bit for bit, broadcast ones too; only 16-bit SiLUs
and products and sums of two 16-bit activations are replaced (not a norm's weight); a bf16 LLaMA trains in ORT with
its MLP's activation and product, its rotary products and sums and its residual sums as PythonOps, and no float32
SiLU, Mul or Add of ORT's left but the norms'; a float32 model keeps ORT's ops."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest
import torch

from ort_zero.memory import output_pool
from ort_zero.ort.step.torch_kernels import (
    NegationInTorch,
    ProductInTorch,
    SiluInTorch,
    SumInTorch,
    negation_in_torch,
    product_in_torch,
    silu_in_torch,
    sum_in_torch,
)
from ort_zero.python_op import function_name, function_name_of

KERNELS = {function_name(f) for f in (NegationInTorch, ProductInTorch, SiluInTorch, SumInTorch)}
LAYERS = 2


@pytest.mark.parametrize("right_shape", [(3, 64), (1, 64), (3, 1), ()])  # one shape, and broadcast
def test_values_and_gradients_are_torchs_bit_for_bit(right_shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    left = torch.randn(3, 64, dtype=torch.bfloat16, requires_grad=True)
    right = torch.randn(right_shape, dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(3, 64, dtype=torch.bfloat16)
    for function, op in ((ProductInTorch, torch.mul), (SumInTorch, torch.add)):
        expected, got = op(left, right), function.apply(left, right)
        assert torch.equal(got, expected)
        expected_grads = torch.autograd.grad(expected, (left, right), grad)
        for got_grad, expected_grad in zip(torch.autograd.grad(got, (left, right), grad), expected_grads, strict=True):
            assert torch.equal(got_grad, expected_grad)
    for function, op in ((SiluInTorch, torch.nn.functional.silu), (NegationInTorch, torch.neg)):
        expected, got = op(left), function.apply(left)
        assert torch.equal(got, expected)
        assert torch.equal(torch.autograd.grad(got, left, grad)[0], torch.autograd.grad(expected, left, grad)[0])


@pytest.mark.parametrize("function", [ProductInTorch, SumInTorch, SiluInTorch, NegationInTorch])
def test_outputs_gradients_and_kept_copies_are_the_output_pools(
    function: type[torch.autograd.Function], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Their pages stay resident from step to step, as the linear layers' do, instead of being faulted in again."""
    pool = output_pool.OutputPool()
    monkeypatch.setattr(output_pool, "POOL", pool)
    monkeypatch.delenv("ORT_ZERO_OUTPUT_POOL", raising=False)
    inputs = [torch.randn(8, 64, dtype=torch.bfloat16, requires_grad=True) for _ in range(2)]
    inputs = inputs[:1] if function in (SiluInTorch, NegationInTorch) else inputs
    output = function.apply(*inputs)
    # a product keeps both factors, the SiLU its input; a sum and a negation keep nothing
    kept = 0 if function in (SumInTorch, NegationInTorch) else len(inputs)
    assert _storage(output) in _pooled_storages(pool)
    assert len(pool.buffers[torch.bfloat16]) == 1 + kept  # the output and the kept copies
    grads = torch.autograd.grad(output, inputs, torch.ones_like(output))
    assert {_storage(grad) for grad in grads} <= _pooled_storages(pool)


def _storage(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def _pooled_storages(pool: output_pool.OutputPool) -> set[int]:
    return {_storage(buffer.tensor) for buffers in pool.buffers.values() for buffer in buffers}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_only_16_bit_silus_and_products_and_sums_of_activations_are_replaced(dtype: torch.dtype) -> None:
    mul = product_in_torch(lambda a, b: torch.mul(a, b))
    add = sum_in_torch(lambda a, b: torch.add(a, b))
    silu = silu_in_torch(lambda input, inplace: torch.nn.functional.silu(input, inplace))
    neg = negation_in_torch(lambda input: torch.neg(input))
    left, right = torch.randn(4, 8, dtype=dtype, requires_grad=True), torch.randn(4, 8, dtype=dtype)
    replaced = dtype == torch.bfloat16
    assert ("SiluInTorch" in type(silu(left).grad_fn).__name__) == replaced
    assert ("NegationInTorch" in type(neg(left).grad_fn).__name__) == replaced
    assert "NegationInTorch" not in type(neg(torch.nn.Parameter(left.detach())).grad_fn).__name__
    for op, name in ((mul, "ProductInTorch"), (add, "SumInTorch")):
        assert (name in type(op(left, right).grad_fn).__name__) == replaced
        assert (name in type(op(left, right[:1]).grad_fn).__name__) == replaced  # broadcast
        weight = torch.nn.Parameter(torch.randn(8, dtype=dtype))
        for other in (weight, 2.0, right.float()):  # a parameter, a number, another dtype: torch's own
            assert name not in type(op(left, other).grad_fn).__name__


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_llama_trains_with_its_mlp_activation_and_product_in_torch(
    llama_in_ort: Callable[..., tuple[dict, object]], dtype: torch.dtype
) -> None:
    record, graph = llama_in_ort(dtype, LAYERS)
    kernels = Counter(name.rsplit(".", 1)[-1] for node in graph.node if (name := function_name_of(node)) in KERNELS)
    sixteen = dtype == torch.bfloat16
    # per layer: the MLP's act_fn(gate) and its product with up; the rotary embedding's four products and two sums;
    # the two residual sums; the rotary embedding's two negations
    per_layer = {"SiluInTorch": 1, "ProductInTorch": 5, "SumInTorch": 4, "NegationInTorch": 2} if sixteen else {}
    assert {name: kernels[name] for name in per_layer} == {name: LAYERS * n for name, n in per_layer.items()}
    torchs = {"QuickGelu", "QuickGeluGrad", "Sigmoid", "Mul", "Add", "Neg"}
    assert not sixteen or not torchs & set(record["float32_fallbacks"])
