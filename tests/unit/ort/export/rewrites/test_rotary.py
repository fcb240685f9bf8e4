"""Llama 4's and DeepSeek-V2's rotary embeddings in real arithmetic (in place of complex numbers) give
transformers' values while ort_zero exports them; each model rewrite applies to the models built from its modeling
file only."""

from __future__ import annotations

import pytest
import torch

import ort_zero  # noqa: F401  (before ORT: makes ORTModule importable on today's torch)
from ort_zero.ort.export import rewrites as export_rewrites
from ort_zero.ort.export.rewrites import rotary as rotary_rewrites

llama4 = pytest.importorskip("transformers.models.llama4.modeling_llama4")
deepseek_v2 = pytest.importorskip("transformers.models.deepseek_v2.modeling_deepseek_v2")


def rotary(config_kwargs: dict) -> torch.nn.Module:
    from transformers import Llama4TextConfig

    config = Llama4TextConfig(hidden_size=32, num_attention_heads=4, head_dim=8, **config_kwargs)
    return llama4.Llama4TextRotaryEmbedding(config)


def test_the_real_rotary_embedding_gives_transformers_values() -> None:
    module = rotary({})
    x, positions = torch.randn(2, 5, 32), torch.arange(5).expand(2, 5)
    complex_freqs = module(x, positions)
    pairs = rotary_rewrites.rotary_pairs(module, x, positions)
    torch.testing.assert_close(pairs, torch.view_as_real(complex_freqs))
    xq, xk = torch.randn(2, 5, 4, 8), torch.randn(2, 5, 2, 8)
    expected = llama4.apply_rotary_emb(xq, xk, complex_freqs)
    for got, want in zip(rotary_rewrites.llama4_rotate_pairs(xq, xk, pairs), expected, strict=True):
        torch.testing.assert_close(got, want)


def test_the_real_deepseek_v2_rotary_embedding_gives_transformers_values() -> None:
    from transformers import DeepseekV2Config

    module = deepseek_v2.DeepseekV2RotaryEmbedding(DeepseekV2Config(hidden_size=32, num_attention_heads=4))
    x, positions = torch.randn(2, 5, 32), torch.arange(5).expand(2, 5)
    complex_freqs = module(x, positions)
    pairs = rotary_rewrites.rotary_pairs(module, x, positions)
    torch.testing.assert_close(pairs, torch.view_as_real(complex_freqs))
    channels = 2 * pairs.shape[-2]  # the rotary part of each head (qk_rope_head_dim)
    xq, xk = torch.randn(2, 4, 5, channels), torch.randn(2, 1, 5, channels)  # batch, head, position, channel
    expected = deepseek_v2.apply_rotary_emb(xq, xk, complex_freqs)
    for got, want in zip(rotary_rewrites.deepseek_v2_rotate_pairs(xq, xk, pairs), expected, strict=True):
        torch.testing.assert_close(got, want)


def test_each_rewrite_applies_to_its_models_only() -> None:
    assert export_rewrites.groups_for(torch.nn.Sequential(rotary({}))) == [export_rewrites.LLAMA4.group]
    config = deepseek_v2.DeepseekV2Config(hidden_size=32, num_attention_heads=4)
    deepseek = deepseek_v2.DeepseekV2RotaryEmbedding(config)
    assert export_rewrites.groups_for(torch.nn.Sequential(deepseek)) == [export_rewrites.DEEPSEEK_V2.group]
    assert export_rewrites.groups_for(torch.nn.Sequential(torch.nn.Linear(2, 2))) == []
