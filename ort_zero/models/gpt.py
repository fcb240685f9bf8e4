"""A small GPT written with plain ops, so that it exports to ONNX and runs in ORTModule unchanged.

Attention is matmul + softmax under a causal-mask buffer (no `scaled_dot_product_attention`, no data-dependent
Python control flow): every op has an ONNX equivalent and the traced graph is the same for any batch or length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn


@dataclass
class GPTConfig:
    """Sizes of the model; the defaults fit a byte-level corpus and a 2-core CPU."""

    vocab_size: int = 256  # bytes
    n_layer: int = 2
    n_head: int = 4
    d_model: int = 128
    max_seq: int = 128
    dropout: float = 0.0
    # Keep only each block's input in training and run the block again in the backward (torch.utils.checkpoint):
    # activation memory of one block instead of all, for one more forward per block. For PyTorch paths (native
    # DeepSpeed, ort_zero's hooks without ORT): ORT cannot run a PyTorch checkpoint, so under ORTModule with ZeRO-3
    # ort_zero replaces it with its own layer-wise recompute of the blocks (ORTMODULE_MEMORY_OPT_LEVEL 1 or 2).
    gradient_checkpointing: bool = False

    def __post_init__(self) -> None:
        if self.d_model % self.n_head:
            raise ValueError(f"d_model ({self.d_model}) must be a multiple of n_head ({self.n_head})")


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention with a fused qkv projection; position i attends to positions <= i."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.d_model = config.d_model
        self.scale = 1.0 / math.sqrt(config.d_model // config.n_head)  # a constant, not traced from a shape
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)
        causal = torch.tril(torch.ones(config.max_seq, config.max_seq, dtype=torch.bool))
        # Not persistent: derived from the config, so checkpoints hold weights only.
        self.register_buffer("causal_mask", causal.view(1, 1, config.max_seq, config.max_seq), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq = x.shape[0], x.shape[1]
        q, k, v = self.qkv(x).split(self.d_model, dim=2)
        q, k, v = (t.reshape(batch, seq, self.n_head, -1).transpose(1, 2) for t in (q, k, v))
        scores = q.matmul(k.transpose(-2, -1)) * self.scale
        scores = scores.masked_fill(~self.causal_mask[:, :, :seq, :seq], float("-inf"))
        attention = self.attn_dropout(F.softmax(scores, dim=-1))
        y = attention.matmul(v).transpose(1, 2).reshape(batch, seq, self.d_model)
        return self.resid_dropout(self.proj(y))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(config.d_model, 4 * config.d_model)
        self.act = nn.GELU()
        self.proj = nn.Linear(4 * config.d_model, config.d_model)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(self.act(self.fc(x))))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.d_model)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.d_model)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """Decoder-only language model; the LM head shares its weight with the token embedding."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.d_model)
        self.wpe = nn.Embedding(config.max_seq, config.d_model)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight
        self.apply(self._init_weights)
        # GPT-2's scaling: each residual branch adds to the stream, so its output projection starts smaller.
        for block in self.blocks:
            for proj in (block.attn.proj, block.mlp.proj):
                nn.init.normal_(proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """`labels[b, i]` is the token that follows `input_ids[b, i]`; with labels the dict also holds the mean loss."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.drop(self.wte(input_ids) + self.wpe(positions))
        # Whether grad is enabled is not asked: ORTModule exports under no_grad, and ort_zero must see the checkpoint
        # there to put its recompute in its place (or refuse it at level 0).
        checkpointed = self.config.gradient_checkpointing and self.training
        for block in self.blocks:
            # Non-reentrant: it restores the RNG state, so a recomputed dropout mask is the one the forward drew.
            x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False) if checkpointed else block(x)
        logits = self.lm_head(self.ln_f(x))
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
        return out
