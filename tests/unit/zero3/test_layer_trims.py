"""A model's layers ask the heap to give back what it freed at their boundaries (after each layer's forward, before
its backward), other modules not (`ModuleState.trims_heap`; the heap: `ort_zero.memory.heap`)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from ort_zero.memory import heap


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x).relu()


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 4)
        self.layers = nn.ModuleList([Block(), Block()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return x.sum()


def test_layers_give_back_at_their_boundaries(subscribe: Callable, monkeypatch: pytest.MonkeyPatch) -> None:
    model = Stack()
    subscribed = subscribe(model)
    trims: list[list[tuple[str, str]]] = []
    monkeypatch.setattr(heap, "give_back_freed_memory", lambda: trims.append(list(subscribed.offload.log)))
    monkeypatch.setattr(heap, "rss_bytes", lambda: heap.LAYER_TRIM_GROWTH)  # grown since the last trim, always
    monkeypatch.setattr(heap.MARK, "rss", 0)  # whatever earlier tests trimmed
    model(torch.randn(2, 4, requires_grad=True)).backward()
    layers = {subscribed.offload.names[m] for m, s in subscribed.subscriber.states.items() if s.trims_heap}
    assert layers == {"layers.0", "layers.1"}
    # after each layer's release in the forward, before each layer's gather for its backward
    assert [log[-1] for log in trims] == [
        ("fwd_release", "layers.0"), ("fwd_release", "layers.1"), ("bwd_gather", "root"), ("bwd_release", "layers.1")
    ]  # fmt: skip
