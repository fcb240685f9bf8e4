"""A stack of wide Linear layers, where gathered parameters dominate memory: ZeRO-3's memory is measured on it."""

from __future__ import annotations

import torch
from torch import nn

# ZeRO-3 settings under which DeepSpeed holds a gathered parameter no longer than its module needs it (no prefetch,
# no persistence, no reuse across modules): what stays gathered is what the hooks keep.
RELEASE_EARLY_ZERO3 = {
    "stage": 3,
    "stage3_prefetch_bucket_size": 0,
    "stage3_max_live_parameters": 0,
    "stage3_max_reuse_distance": 0,
    "stage3_param_persistence_threshold": 0,
    "reduce_bucket_size": 1e6,
    "allgather_bucket_size": 1e6,
}


class LinearStack(nn.Module):
    """`depth` residual `x + tanh(Linear(x))` layers of `width`; the loss is the output's mean square."""

    def __init__(self, width: int = 2048, depth: int = 8) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + torch.tanh(layer(x))
        return x.square().mean()
