"""A 16-bit model's RMSNorm as torch's kernels in ORT's graph (ort_zero/ort/step/torch_kernels/norms.py): the
Function's output is transformers' bit for bit and its gradients are autograd's to the last bf16 unit; it keeps the
input and the rows' statistics only, in the output pool; only LLaMA-form norms on one 16-bit input are replaced;
a bf16 LLaMA trains in ORT with every norm a PythonOp and no float32 norm of ORT's left, a float32 one keeps ORT's."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers.models.gemma.modeling_gemma import GemmaRMSNorm
from transformers.models.llama.modeling_llama import LlamaRMSNorm
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

from ort_zero.memory import output_pool
from ort_zero.ort.step.torch_kernels import RmsNormInTorch, rms_norm_in_torch
from ort_zero.ort.step.torch_kernels.norms import is_llamas_rms_norm
from ort_zero.python_op import function_name, function_name_of

HIDDEN = 96


def _norm(cls: type = LlamaRMSNorm, dtype: torch.dtype = torch.bfloat16) -> torch.nn.Module:
    torch.manual_seed(0)
    norm = cls(HIDDEN, eps=1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.3)
    return norm


def _ulps_apart(left: torch.Tensor, right: torch.Tensor) -> int:
    """The largest distance between two bf16 tensors in units of the last place (bf16's ordering as int16)."""
    as_int = [t.contiguous().view(torch.int16).int() for t in (left, right)]
    ordered = [torch.where(i < 0, -32768 - i, i) for i in as_int]  # sign-magnitude to two's complement order
    return int((ordered[0] - ordered[1]).abs().max())


@pytest.mark.parametrize("rows", [(4, 16), (2, 3, 16)])
def test_output_is_transformers_bit_for_bit_and_gradients_autograds_to_the_last_bf16_unit(rows: tuple) -> None:
    norm = _norm()
    input = torch.randn(*rows[:-1], HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(*rows[:-1], HIDDEN, dtype=torch.bfloat16)
    expected, got = norm(input), RmsNormInTorch.apply(input, norm, norm.weight)
    assert torch.equal(got, expected)
    expected_grads = torch.autograd.grad(expected, (input, norm.weight), grad)
    got_grads = torch.autograd.grad(got, (input, norm.weight), grad)
    for got_grad, expected_grad in zip(got_grads, expected_grads, strict=True):
        assert got_grad.dtype == expected_grad.dtype == torch.bfloat16
        assert _ulps_apart(got_grad, expected_grad) <= 1  # float32 sums of another order, rounded once


def test_a_frozen_weight_gets_zeros_where_asked() -> None:
    norm = _norm()
    norm.weight.requires_grad_(False)
    weight = norm.weight.detach().clone().requires_grad_(True)  # ORT's gathered copy, on a differentiable path
    input = torch.randn(4, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    input_grad, weight_grad = torch.autograd.grad(RmsNormInTorch.apply(input, norm, weight).sum(), (input, weight))
    assert torch.equal(weight_grad, torch.zeros_like(weight))
    assert torch.equal(input_grad, torch.autograd.grad(norm(input).sum(), input)[0])


def test_it_keeps_the_input_and_statistics_only_and_its_buffers_are_the_output_pools(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """autograd on transformers' norm keeps a float32 copy of the input and the normalized rows besides; here the
    input is kept as a pool copy (ORT reuses its inputs' buffers), and the output and input gradient are pooled."""
    pool = output_pool.OutputPool()
    monkeypatch.setattr(output_pool, "POOL", pool)
    monkeypatch.delenv("ORT_ZERO_OUTPUT_POOL", raising=False)
    norm = _norm()
    input = torch.randn(8, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    captured = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        captured.setdefault("saved", []).append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        output = RmsNormInTorch.apply(input, norm, norm.weight)
    assert "saved" not in captured  # what it keeps is its own, not autograd's saved tensors
    input_copy, inverse_rms, weight = output.grad_fn.kept
    assert torch.equal(input_copy, input) and input_copy.untyped_storage().data_ptr() != input.data_ptr()
    assert inverse_rms.shape == (8, 1) and inverse_rms.dtype == torch.float32 and weight.shape == (HIDDEN,)
    assert {_storage(output), _storage(input_copy)} <= _pooled_storages(pool)
    input_grad = torch.autograd.grad(output, input, torch.ones_like(output))[0]
    assert _storage(input_grad) in _pooled_storages(pool)


class RowSizedResults(TorchDispatchMode):
    """The storages of every op's new result with at least `numel` elements (the norm's row-sized temporaries; views
    and `out=` results share an argument's storage, and are not counted)."""

    def __init__(self, numel: int) -> None:
        super().__init__()
        self.numel, self.storages = numel, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        given = {_storage(t) for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)}
        result = func(*args, **kwargs)
        for tensor in result if isinstance(result, tuple) else (result,):
            if isinstance(tensor, torch.Tensor) and tensor.numel() >= self.numel and _storage(tensor) not in given:
                self.storages.append((func.__name__, tensor.dtype, _storage(tensor)))
        return result


def test_its_float32_temporaries_are_the_output_pools_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers computes the rows' statistics in float32: a float32 copy of the input and its products, forward
    and backward. Fresh, each is faulted in again after the heap's trims (at seq 2048, most of the norms' 6 MiB
    temporaries in every forward); from the pool they stay resident. Nothing row-sized is allocated but the pool's."""
    pool = output_pool.OutputPool()
    monkeypatch.setattr(output_pool, "POOL", pool)
    monkeypatch.delenv("ORT_ZERO_OUTPUT_POOL", raising=False)
    norm = _norm()
    input = torch.randn(8, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(8, HIDDEN, dtype=torch.bfloat16)
    with RowSizedResults(input.numel()) as results:
        output = RmsNormInTorch.apply(input, norm, norm.weight)
        torch.autograd.grad(output, (input, norm.weight), grad)
    assert {dtype for _, dtype, _ in results.storages} == {torch.bfloat16, torch.float32}
    assert [(op, dtype) for op, dtype, storage in results.storages if storage not in _pooled_storages(pool)] == []


def _storage(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def _pooled_storages(pool: output_pool.OutputPool) -> set[int]:
    return {_storage(buffer.tensor) for buffers in pool.buffers.values() for buffer in buffers}


def test_only_llama_form_norms_on_one_16_bit_input_are_replaced() -> None:
    calls = []
    slow_forward = rms_norm_in_torch(lambda module, *args, **kwargs: calls.append(module) or module.forward(*args))
    bf16 = torch.randn(2, HIDDEN, dtype=torch.bfloat16)
    assert is_llamas_rms_norm(_norm()) and is_llamas_rms_norm(_norm(Qwen3RMSNorm))  # a family's copy of LLaMA's
    assert not is_llamas_rms_norm(_norm(GemmaRMSNorm))  # scales by 1 + weight: ORT's fused norm
    assert "RmsNormInTorch" in type(slow_forward(_norm(Qwen3RMSNorm), bf16).grad_fn).__name__
    for module, input in (
        (_norm(GemmaRMSNorm), bf16),
        (_norm(dtype=torch.float32), bf16.float()),  # float32: ORT's fused norm has its kernel
        (torch.nn.Linear(HIDDEN, HIDDEN).to(torch.bfloat16), bf16),
    ):
        calls.clear()
        slow_forward(module, input)
        assert calls == [module], module


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_llama_trains_in_ort_with_its_norms_in_torch(
    llama_in_ort: Callable[..., tuple[dict, object]], dtype: torch.dtype
) -> None:
    layers = 2
    record, graph = llama_in_ort(dtype, layers)
    norms = Counter(function_name_of(node) for node in graph.node)[function_name(RmsNormInTorch)]
    fused = {node.op_type for node in graph.node} & {"SimplifiedLayerNormalization", "SimplifiedLayerNormalizationGrad"}
    sixteen = dtype == torch.bfloat16
    assert norms == (2 * layers + 1 if sixteen else 0)  # each layer's two and the final norm
    assert not fused if sixteen else fused == {"SimplifiedLayerNormalization", "SimplifiedLayerNormalizationGrad"}
    assert not {"SimplifiedLayerNormalization", "SimplifiedLayerNormalizationGrad"} & set(record["float32_fallbacks"])
