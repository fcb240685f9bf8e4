"""MoE experts that route tokens in Python (DBRX, JetMoE, LongCat-Flash): `nonzero`/`.item()` loops and `tolist()`
split sizes, which a trace keeps as the traced batch's routing. While such a model is exported each (token, expert)
pair gathers its expert's weights for batched matmuls, as transformers' `batched_mm` experts do; JetMoE's
`Tensor.index_add` sums through a one-hot matrix (torch's exporter writes it as a scatter that drops repeated indices'
sums)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from .model_rewrite import ModelRewrite, Replacement, instead


def dbrx_experts_batched(
    self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """`DbrxExperts.forward` without routing in Python: every token repeated once per chosen expert, the GLU of
    that expert (weights gathered by index) in batched matmuls, weighted and summed back per token."""
    batch_size, hidden = hidden_states.shape[0], self.hidden_size
    tokens = hidden_states.reshape(-1, hidden)
    top_k = top_k_index.shape[-1]
    pairs = tokens.unsqueeze(1).expand(-1, top_k, -1).reshape(-1, 1, hidden)  # (tokens * top_k, 1, hidden)
    experts = top_k_index.reshape(-1)
    shape = (self.num_experts, self.ffn_hidden_size, hidden)
    w1, v1, w2 = (weight.view(shape)[experts] for weight in (self.mlp.w1, self.mlp.v1, self.mlp.w2))
    gated = self.mlp.activation_fn(pairs @ w1.transpose(1, 2)) * (pairs @ v1.transpose(1, 2))
    out = (gated @ w2).reshape(-1, hidden) * top_k_weights.reshape(-1, 1)
    return out.view(-1, top_k, hidden).sum(dim=1).view(batch_size, -1, hidden)


def longcat_flash_experts_batched(
    self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """`LongcatFlashExperts.forward` without routing in Python: every token repeated once per chosen expert; a pair
    routed to one of the real experts (index below `num_routed_experts`) runs its GLU with gathered weights, one
    routed to a zero-compute expert keeps its input; weighted and summed back per token."""
    top_k, hidden = top_k_index.shape[-1], hidden_states.shape[-1]
    pairs = hidden_states.unsqueeze(1).expand(-1, top_k, -1).reshape(-1, hidden)
    experts = top_k_index.reshape(-1)
    out = pairs
    if self.gate_up_proj is not None:
        real = experts.clamp(max=self.num_routed_experts - 1)  # any real expert for the zero-compute pairs
        gate, up = (pairs.unsqueeze(1) @ self.gate_up_proj[real].transpose(1, 2)).chunk(2, dim=-1)
        computed = ((self.act_fn(gate) * up) @ self.down_proj[real].transpose(1, 2)).squeeze(1)
        out = torch.where((experts < self.num_routed_experts).unsqueeze(1), computed, pairs)
    out = out * top_k_weights.reshape(-1, 1)
    return out.view(-1, top_k, hidden).sum(dim=1).to(hidden_states.dtype)


def jetmoe_gating_experts_of_rows(self: Any, hidden_states: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """`JetMoeTopKGating.forward` handing on, where transformers hands the tokens per expert (a list of ints), the
    expert of each row sorted by expert (a tensor; the experts' forward is the only reader): the rows' order, the
    token and gate of each row, their experts and the router logits."""
    logits = self.layer(hidden_states).float()
    top_logits, top_experts = logits.topk(self.top_k, dim=1)
    gates = torch.softmax(top_logits, dim=1).type_as(hidden_states).flatten()
    experts_of_rows, order = top_experts.flatten().sort(0)
    return order, order.div(self.top_k, rounding_mode="trunc"), gates[order], experts_of_rows, logits


def jetmoe_experts_by_row(self: Any, inputs: torch.Tensor, experts_of_rows: torch.Tensor) -> torch.Tensor:
    """`JetMoeParallelExperts.forward` on rows sorted by expert, each multiplied by its expert's (gathered) weight
    in one batched matmul."""
    return (self.weight[experts_of_rows] @ inputs.unsqueeze(-1)).squeeze(-1)


def index_add_by_one_hot(index_add: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """`Tensor.index_add` as a sum through a one-hot matrix (destination rows by source rows), which exports as a
    MatMul: torch's exporter writes index_add as a scatter that is wrong wherever `index` repeats (it warns so)."""

    @functools.wraps(index_add)
    def index_add_summed(
        self: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor, *, alpha: float = 1
    ) -> torch.Tensor:
        first_column = self.movedim(dim, 0).unsqueeze(-1).flatten(1)[:, 0]
        rows = torch.ones_like(first_column, dtype=torch.long).cumsum(0) - 1  # 0 .. rows - 1, from data, not a size
        one_hot = (rows.unsqueeze(1) == index).to(source.dtype)  # (destination rows, source rows)
        moved = source.movedim(dim, 0)
        added = (one_hot @ moved.reshape(moved.shape[0], -1)).reshape(-1, *moved.shape[1:]).movedim(0, dim)
        return self + (added if alpha == 1 else alpha * added)

    return index_add_summed


_DBRX = "transformers.models.dbrx.modeling_dbrx"
DBRX = ModelRewrite(
    "export_dbrx",
    _DBRX,
    ("dbrx",),
    "DBRX's experts loop in Python over the experts the batch routes to (nonzero, then torch.where per expert), so "
    "the trace keeps the traced batch's routing as constants (ORT's Split fails on the next batch): while it is "
    "exported, each (token, expert) pair gathers its expert's weights and runs one batched matmul, as transformers' "
    "batched_mm experts do (the same values and gradients)",
    (
        Replacement(
            "transformers.dbrx_experts_in_export", f"{_DBRX}:DbrxExperts.forward",
            instead(dbrx_experts_batched),
        ),
    ),
)  # fmt: skip
_JETMOE = "transformers.models.jetmoe.modeling_jetmoe"
JETMOE = ModelRewrite(
    "export_jetmoe",
    _JETMOE,
    ("jetmoe",),
    "JetMoE's experts split their sorted rows by tokens per expert made Python ints (expert_size.tolist()), which "
    "the trace keeps as constants (ORT's Reshape fails in the backward on the next batch): while it is exported, "
    "the gate hands on the expert of each sorted row instead, and each row gathers its expert's weight for one "
    "batched matmul (the same values and gradients). Its tokens are summed back with Tensor.index_add, which torch's "
    "exporter writes as a scatter that keeps one of the rows sent to the same token instead of their sum: while "
    "JetMoE is exported, index_add sums through a one-hot matrix (tokens x routed rows: its size and time grow with "
    "the square of the tokens in a batch)",
    (
        Replacement(
            "transformers.jetmoe_gating_in_export", f"{_JETMOE}:JetMoeTopKGating.forward",
            instead(jetmoe_gating_experts_of_rows),
        ),
        Replacement(
            "transformers.jetmoe_experts_in_export", f"{_JETMOE}:JetMoeParallelExperts.forward",
            instead(jetmoe_experts_by_row),
        ),
        Replacement("torch.index_add_in_jetmoe_export", "torch:Tensor.index_add", index_add_by_one_hot),
    ),
)  # fmt: skip
_LONGCAT_FLASH = "transformers.models.longcat_flash.modeling_longcat_flash"
LONGCAT_FLASH = ModelRewrite(
    "export_longcat_flash",
    _LONGCAT_FLASH,
    ("longcat_flash",),
    "LongCat-Flash's experts loop in Python over the experts the batch routes to (nonzero, .item(), torch.where) "
    "and squeeze(0) each expert's (top_k, tokens) mask, a no-op in PyTorch that the exporter writes as a Squeeze "
    "of a dimension of top_k (ORT's symbolic shape inference asserts; the node could not run either): while it is "
    "exported, each (token, expert) pair gathers its expert's weights for batched matmuls, and pairs routed to a "
    "zero-compute expert keep their input (the same values and gradients)",
    (
        Replacement(
            "transformers.longcat_flash_experts_in_export", f"{_LONGCAT_FLASH}:LongcatFlashExperts.forward",
            instead(longcat_flash_experts_batched),
        ),
    ),
)  # fmt: skip
