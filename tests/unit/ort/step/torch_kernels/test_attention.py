"""Attention as torch's fused kernel in ORT's graph (ort_zero/ort/step/torch_kernels/attention.py): the Function gives
torch's values and gradients for the masks and head layouts transformers passes; a LLaMA with sdpa attention trains
in ORT with PyTorch's loss and gradients and ORT keeps no seq x seq tensor for the backward, where without the patch it
keeps three per layer (probabilities, NaN mask, masked probabilities); eager attention is exported as before."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import LlamaForCausalLM

from ort_zero.ort.step.torch_kernels import ScaledDotProductAttention
from ort_zero.python_op import function_name

F = torch.nn.functional
KERNEL = function_name(ScaledDotProductAttention)
TrainStep = Callable[..., dict]
LlamaMaker = Callable[..., LlamaForCausalLM]


def seq_by_seq(kept: list[tuple[str, str, list]]) -> list[tuple[str, str, list]]:
    """The kept values with two dimensions of one symbolic length (the sequence's): attention's probabilities."""
    return [value for value in kept if len(named := [d for d in value[2] if isinstance(d, str)]) > len(set(named))]


def _mask(kind: str, seq: int) -> torch.Tensor | None:
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()
    if kind == "bool":
        return causal.clone().expand(2, 1, seq, seq).clone()
    if kind == "float":
        return torch.zeros(2, 1, seq, seq).masked_fill(~causal, float("-inf"))
    if kind == "sliding":
        return (causal & ~torch.ones(seq, seq, dtype=torch.bool).tril(-4)).expand(2, 1, seq, seq).clone()
    return None


@pytest.mark.parametrize("mask_kind", ["none", "bool", "float", "sliding"])
@pytest.mark.parametrize("gqa", [False, True])
def test_function_gives_torch_values_and_gradients(mask_kind: str, gqa: bool) -> None:
    torch.manual_seed(0)
    q = torch.randn(2, 4, 16, 8, requires_grad=True)
    k, v = (torch.randn(2, 2 if gqa else 4, 16, 8, requires_grad=True) for _ in range(2))
    mask, causal = _mask(mask_kind, 16), mask_kind == "none"
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=0.3, enable_gqa=gqa)
    expected_grads = torch.autograd.grad(expected.square().sum(), (q, k, v))
    got = ScaledDotProductAttention.apply(q, k, v, mask, 0.0, causal, 0.3, gqa)
    grads = torch.autograd.grad(got.square().sum(), (q, k, v))
    torch.testing.assert_close(got, expected)
    for grad, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, want)


class FlashCalls(TorchDispatchMode):
    """(is_causal, whether a mask was passed) of every call of torch's CPU flash-attention kernel and its backward."""

    KERNELS = ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward")

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, bool, bool]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        if (kernel := func.__name__.split(".")[0]) in self.KERNELS:
            given = {**{a.name: v for a, v in zip(func._schema.arguments, args, strict=False)}, **kwargs}
            self.seen.append((kernel, bool(given.get("is_causal", False)), given.get("attn_mask") is not None))
        return func(*args, **kwargs)


@pytest.mark.parametrize(("mask_kind", "as_causal"), [("bool", True), ("sliding", False), ("float", False)])
def test_a_causal_mask_runs_as_torch_causal_kernel(mask_kind: str, as_causal: bool) -> None:
    """transformers passes a causal bool mask while ORTModule traces (natively `is_causal=True`, no mask): torch's
    kernel then computes the masked half too; it must run as natively, forward and backward."""
    q, k, v = (torch.randn(2, 2, 16, 8, requires_grad=True) for _ in range(3))
    with FlashCalls() as calls:
        ScaledDotProductAttention.apply(q, k, v, _mask(mask_kind, 16), 0.0, False, None, False).sum().backward()
    assert calls.seen == [(kernel, as_causal, not as_causal) for kernel in FlashCalls.KERNELS]


def _kept_shapes(output: torch.Tensor) -> list[tuple[int, ...]]:
    """The shapes of what the Function keeps for its backward: its kept graph's inputs and the tensors that graph's
    nodes saved."""
    inputs, kept_output = output.grad_fn.graph
    shapes, nodes, seen = [tuple(t.shape) for t in inputs], [kept_output.grad_fn], set()
    while nodes:
        if (node := nodes.pop()) is None or node in seen:
            continue
        seen.add(node)
        saved = (getattr(node, name) for name in dir(node) if name.startswith("_saved_"))
        shapes += [tuple(t.shape) for t in saved if isinstance(t, torch.Tensor)]
        nodes += [next_node for next_node, _ in node.next_functions]
    return shapes


@pytest.mark.parametrize(("mask_kind", "keeps_a_mask"), [("bool", False), ("sliding", True)])
def test_a_causal_mask_is_not_kept_for_the_backward(mask_kind: str, keeps_a_mask: bool) -> None:
    """Given a bool mask torch's kernel keeps a float copy of it per layer (16 MiB at seq 2048), the Function its own
    copy: a causal one runs as `is_causal`, and nothing seq x seq is kept."""
    q, k, v = (torch.randn(2, 2, 32, 8, requires_grad=True) for _ in range(3))
    output = ScaledDotProductAttention.apply(q, k, v, _mask(mask_kind, 32), 0.0, False, None, False)
    assert any(shape[-2:] == (32, 32) for shape in _kept_shapes(output)) == keeps_a_mask


def test_a_call_torch_refuses_names_the_way_out() -> None:
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(RuntimeError, match="attn_implementation='eager'"):
        ScaledDotProductAttention.apply(q, q, q, torch.ones(1, 1, 4, 4, dtype=torch.int32), 0.0, False, None, False)


@pytest.mark.parametrize("padded", [False, True])
def test_sdpa_llama_trains_in_ort_keeping_no_seq_by_seq_tensor(
    train_step: TrainStep, tiny_llama: LlamaMaker, padded: bool
) -> None:
    result = train_step(lambda: tiny_llama("sdpa", use_cache=False), ("torch_kernels",), padded=padded)
    assert KERNEL in result["record"]["python_ops"]
    assert seq_by_seq(result["kept"]) == []


def test_without_the_kernel_ort_keeps_attention_probabilities_per_layer(
    train_step: TrainStep, tiny_llama: LlamaMaker
) -> None:
    # padded, ORT's gradients are NaN: see docs
    result = train_step(lambda: tiny_llama("sdpa", use_cache=False), (), padded=False)
    assert KERNEL not in result["record"]["python_ops"]
    assert len({name.split("/self_attn")[0] for name, _, _ in seq_by_seq(result["kept"])}) == 2  # both layers


def test_eager_attention_is_exported_as_onnx_ops(train_step: TrainStep, tiny_llama: LlamaMaker) -> None:
    result = train_step(lambda: tiny_llama("eager", use_cache=False), ("torch_kernels",))
    assert KERNEL not in result["record"]["python_ops"]
    assert seq_by_seq(result["kept"])


def test_the_trace_runs_no_attention_on_values_of_zeros(monkeypatch: pytest.MonkeyPatch) -> None:
    """While a ZeRO-3 model is exported its values are a projection of zero stand-ins: the output is what torch's
    kernel gives on them, without the kernel; values that are not zeros are attended to."""
    from ort_zero.hooks.export_mode import exporting
    from ort_zero.ort.step.torch_kernels import attention

    q, k = torch.randn(2, 4, 16, 8, dtype=torch.bfloat16), torch.randn(2, 2, 16, 8, dtype=torch.bfloat16)
    zeros, v = torch.zeros(2, 2, 16, 6, dtype=torch.bfloat16), torch.randn(2, 2, 16, 6, dtype=torch.bfloat16)
    calls: list[int] = []
    kernel = attention._torch_attention
    monkeypatch.setattr(attention, "_torch_attention", lambda *a, **o: calls.append(1) or kernel(*a, **o))
    with exporting():
        traced = ScaledDotProductAttention.apply(q, k, zeros, _mask("bool", 16), 0.0, False, None, True)
        assert calls == []
        attended = ScaledDotProductAttention.apply(q, k, v, _mask("bool", 16), 0.0, False, None, True)
        assert calls == [1]
    computed = torch.nn.functional.scaled_dot_product_attention(q, k, zeros, _mask("bool", 16), enable_gqa=True)
    assert traced.dtype == computed.dtype and traced.shape == computed.shape == (2, 4, 16, 6)
    torch.testing.assert_close(traced, computed, rtol=0, atol=0)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, _mask("bool", 16), enable_gqa=True)
    torch.testing.assert_close(attended, expected)
