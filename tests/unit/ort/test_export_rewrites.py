"""Llama 4's rotary embedding in real arithmetic (what ort_zero exports in place of transformers' complex numbers)
gives transformers' values, and the rewrite applies to the models built from Llama 4's modeling file only."""

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
