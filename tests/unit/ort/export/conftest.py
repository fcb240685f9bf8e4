"""What the export tests share: a model that puts one op on the gradient's path."""

from __future__ import annotations

from collections.abc import Callable

import torch


class Op(torch.nn.Module):
    """One op between two Linear layers, so that its gradient must flow back to trained weights."""

    def __init__(self, op: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.op = op
        self.inner, self.outer = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.outer(self.op(self.inner(x))).square().mean()
