"""A 16-bit SiLU and products of like tensors as torch's kernels in ORT's graph (ort_zero/ort/torch_kernels/
elementwise.py): the Functions' values and gradients are torch's bit for bit; only 16-bit SiLUs and same-shape 16-bit
products are replaced; a bf16 LLaMA trains in ORT with its MLP's activation and product as PythonOps, no float32
SiLU of ORT's left; a float32 model keeps ORT's ops."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable

import pytest
import torch
from transformers import LlamaForCausalLM

from ort_zero import patches
from ort_zero.foreign import ortmodule as ort_internals
from ort_zero.ort.inspection import ort_run_record
from ort_zero.ort.torch_kernels import ProductInTorch, SiluInTorch, product_in_torch, silu_in_torch
from ort_zero.python_op import function_name, function_name_of

KERNELS = {function_name(ProductInTorch), function_name(SiluInTorch)}
LAYERS = 2
ortmodule = importlib.import_module("onnxruntime.training.ortmodule")


def test_values_and_gradients_are_torchs_bit_for_bit() -> None:
    torch.manual_seed(0)
    left, right = (torch.randn(3, 64, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    grad = torch.randn(3, 64, dtype=torch.bfloat16)
    expected = left * right
    expected_grads = torch.autograd.grad(expected, (left, right), grad)
    got = ProductInTorch.apply(left, right)
    assert torch.equal(got, expected)
    for got_grad, expected_grad in zip(torch.autograd.grad(got, (left, right), grad), expected_grads, strict=True):
        assert torch.equal(got_grad, expected_grad)
    expected = torch.nn.functional.silu(left)
    got = SiluInTorch.apply(left)
    assert torch.equal(got, expected)
    assert torch.equal(torch.autograd.grad(got, left, grad)[0], torch.autograd.grad(expected, left, grad)[0])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_only_16_bit_silus_and_products_of_one_shape_are_replaced(dtype: torch.dtype) -> None:
    mul = product_in_torch(lambda a, b: torch.mul(a, b))
    silu = silu_in_torch(lambda input, inplace: torch.nn.functional.silu(input, inplace))
    left, right = torch.randn(4, 8, dtype=dtype, requires_grad=True), torch.randn(4, 8, dtype=dtype)
    replaced = dtype == torch.bfloat16
    assert ("SiluInTorch" in type(silu(left).grad_fn).__name__) == replaced
    assert ("ProductInTorch" in type(mul(left, right).grad_fn).__name__) == replaced
    for other in (right[:1], 2.0, right.float()):  # broadcasting, a number, another dtype: torch's own
        assert "ProductInTorch" not in type(mul(left, other).grad_fn).__name__


def _step(model: torch.nn.Module, ids: torch.Tensor) -> tuple[float, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return float(loss), {n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_llama_trains_with_its_mlp_activation_and_product_in_torch(
    enabled: None, tiny_llama: Callable[..., LlamaForCausalLM], dtype: torch.dtype
) -> None:
    torch.manual_seed(0)
    reference = tiny_llama("sdpa", layers=LAYERS).to(dtype)
    model = tiny_llama("sdpa", layers=LAYERS).to(dtype)
    model.load_state_dict(reference.state_dict())
    ids = torch.randint(0, 96, (2, 24))
    in_ort = ortmodule.ORTModule(model)
    with contextlib.ExitStack() as stack:
        stack.enter_context(patches.applied("torch_kernels"))
        got = [_step(in_ort, ids) for _ in range(2)]  # the second: a kept input ORT reused would show
    expected = [_step(reference, ids) for _ in range(2)]
    record = ort_run_record(in_ort)["training"]
    assert record["session"], "no ORT session: the model did not run in ORT"
    graph = ort_internals.optimized_model(ort_internals.execution_manager(in_ort, training=True)).graph
    kernels = [node for node in graph.node if function_name_of(node) in KERNELS]
    sixteen = dtype == torch.bfloat16
    assert len(kernels) == (2 * LAYERS if sixteen else 0)  # each MLP's act_fn(gate) and its product with up
    assert not sixteen or not {"QuickGelu", "QuickGeluGrad", "Sigmoid"} & set(record["float32_fallbacks"])
    rtol, atol = (5e-2, 5e-3) if sixteen else (1e-4, 1e-5)  # bf16: a few ulps of its 8-bit mantissa
    for (loss, grads), (expected_loss, expected_grads) in zip(got, expected, strict=True):
        assert loss == pytest.approx(expected_loss, rel=1e-2 if sixteen else 1e-5)
        for name, grad in expected_grads.items():
            torch.testing.assert_close(grads[name], grad, rtol=rtol, atol=atol)
