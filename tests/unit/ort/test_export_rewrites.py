"""Model code rewritten while ort_zero exports it gives transformers' values: Llama 4's rotary embedding in real
arithmetic (in place of complex numbers) and the left-padded causal convolution of the linear-attention models; each
rewrite applies to the models built from its modeling file only."""

from __future__ import annotations

import pytest
import torch

from ort_zero.ort import export_rewrites

llama4 = pytest.importorskip("transformers.models.llama4.modeling_llama4")


def rotary(config_kwargs: dict) -> torch.nn.Module:
    from transformers import Llama4TextConfig

    config = Llama4TextConfig(hidden_size=32, num_attention_heads=4, head_dim=8, **config_kwargs)
    return llama4.Llama4TextRotaryEmbedding(config)


def test_the_real_rotary_embedding_gives_transformers_values() -> None:
    module = rotary({})
    x, positions = torch.randn(2, 5, 32), torch.arange(5).expand(2, 5)
    complex_freqs = module(x, positions)
    pairs = export_rewrites.llama4_rotary_pairs(module, x, positions)
    torch.testing.assert_close(pairs, torch.view_as_real(complex_freqs))
    xq, xk = torch.randn(2, 5, 4, 8), torch.randn(2, 5, 2, 8)
    expected = llama4.apply_rotary_emb(xq, xk, complex_freqs)
    for got, want in zip(export_rewrites.llama4_rotate_pairs(xq, xk, pairs), expected, strict=True):
        torch.testing.assert_close(got, want)


def test_the_rewrite_applies_to_llama4_models_only() -> None:
    assert export_rewrites.groups_for(torch.nn.Sequential(rotary({}))) == [export_rewrites.LLAMA4.group]
    assert export_rewrites.groups_for(torch.nn.Sequential(torch.nn.Linear(2, 2))) == []


qwen3_5 = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")


@pytest.mark.parametrize(("bias", "activation"), [(True, "silu"), (False, "silu"), (False, None)])
def test_the_left_padded_causal_conv_gives_transformers_values_and_gradients(
    bias: bool, activation: str | None
) -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 6, 9, requires_grad=True)
    weight = torch.randn(6, 4, requires_grad=True)
    b = torch.randn(6, requires_grad=True) if bias else None
    inputs = [t for t in (x, weight, b) if t is not None]
    expected = qwen3_5.causal_conv1d_fn(x, weight, b, activation=activation)
    expected_grads = torch.autograd.grad(expected.square().sum(), inputs)
    got = export_rewrites.causal_conv_padded_left(x, weight, b, activation=activation)
    grads = torch.autograd.grad(got.square().sum(), inputs)
    torch.testing.assert_close(got, expected)
    for grad, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, want)


def test_the_causal_conv_rewrite_applies_to_its_modeling_files_only() -> None:
    from transformers import Qwen3_5TextConfig

    config = Qwen3_5TextConfig(hidden_size=32, linear_num_key_heads=2, linear_num_value_heads=2)
    layer = qwen3_5.Qwen3_5GatedDeltaNet(config, layer_idx=0)
    qwen3_5_group = next(r.group for r in export_rewrites.CAUSAL_CONVS if r.modeling_module == qwen3_5.__name__)
    assert export_rewrites.groups_for(torch.nn.Sequential(layer)) == [qwen3_5_group]
    assert len({rewrite.group for rewrite in export_rewrites.CAUSAL_CONVS}) == len(export_rewrites.CAUSAL_CONVS)
