"""Toy models that together exercise every ZeRO-3 hook path ort_zero must get right."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, WIDTH = 64, 32


class Block(nn.Module):
    """Called twice per forward by its parent; takes a keyword argument; returns a tuple."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)  # 32-element weights: below the persistence threshold
        self.proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor, *, scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.proj(self.norm(x)) * scale
        return x + F.gelu(y), y.abs().mean()


class Zoo(nn.Module):
    """Tied embedding/LM head, a block called twice, a frozen layer, dict outputs and kwargs inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, WIDTH)
        self.block = Block()
        self.frozen = nn.Linear(WIDTH, WIDTH)
        self.frozen.requires_grad_(False)
        self.mix = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh())  # called once: can be a z3 leaf module
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.wte.weight  # tied: one parameter in two modules

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        h = self.wte(input_ids)
        h, aux1 = self.block(h, scale=1.0)
        h = self.frozen(h) + self.mix(h)
        h, aux2 = self.block(h, scale=0.5)
        logits = self.head(h)
        # A parameter used outside its owning module: the embedding table read directly in the parent.
        logits = logits + 0.1 * F.linear(h, self.wte.weight)
        out = {"logits": logits}
        if labels is not None:
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))
            out["loss"] = loss + 0.01 * (aux1 + aux2)
        return out


class HuggingFace(nn.Module):
    """A Hugging Face transformers model built from a small config (no download), dropout off."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        import transformers

        if kind == "gpt2":
            config = transformers.GPT2Config(
                vocab_size=VOCAB,
                n_positions=64,
                n_embd=WIDTH,
                n_layer=2,
                n_head=4,
                resid_pdrop=0.0,
                embd_pdrop=0.0,
                attn_pdrop=0.0,
                attn_implementation="eager",
            )
            self.model = transformers.GPT2LMHeadModel(config)
        else:
            config = transformers.BertConfig(
                vocab_size=VOCAB,
                hidden_size=WIDTH,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=2 * WIDTH,
                max_position_embeddings=64,
                hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0,
                attn_implementation="eager",
            )
            self.model = transformers.BertForMaskedLM(config)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": self.model(input_ids=input_ids, labels=labels).loss}


def small_gpt(dropout: float = 0.0) -> nn.Module:
    """ort_zero's own small GPT: tied embeddings, LayerNorm, causal attention, GELU."""
    from ort_zero.models.gpt import GPT, GPTConfig

    return GPT(GPTConfig(vocab_size=VOCAB, n_layer=2, n_head=4, d_model=WIDTH, max_seq=64, dropout=dropout))


MODELS = {
    "zoo": Zoo,
    "gpt": small_gpt,
    "gpt-dropout": lambda: small_gpt(dropout=0.1),
    "gpt2": lambda: HuggingFace("gpt2"),
    "bert": lambda: HuggingFace("bert"),
}


def batch(step: int, rank: int, micro_batch: int = 4, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Deterministic per (step, rank), learnable (each token follows from the last by a fixed rule, from a random
    start), with a sequence length that varies with the step."""
    generator = torch.Generator().manual_seed(1000 * step + rank)
    seq = 8 + 4 * (step % 3)
    tokens = [torch.randint(0, VOCAB, (micro_batch,), generator=generator)]
    for _ in range(seq):
        tokens.append((tokens[-1] * 5 + 3) % VOCAB)
    ids = torch.stack(tokens, dim=1)
    return {"input_ids": ids[:, :-1].contiguous().to(device), "labels": ids[:, 1:].contiguous().to(device)}
