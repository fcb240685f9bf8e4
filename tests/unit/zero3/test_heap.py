"""The heap gives back what it freed (`ort_zero.zero3.heap`), and a model's layers ask it to at their boundaries
(after each layer's forward, before its backward), other modules not. What it saves at real size is measured in
docs/benchmarks.md; here, that freed heap memory leaves RSS, which glibc alone does not do."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable

import pytest
import torch
from torch import nn

from ort_zero.zero3 import heap

MIB = 2**20

# In a fresh process, so that the heap is laid out as the script says. Prints RSS (MiB) with the blocks, after
# freeing them, after the heap gave back.
FREED_BLOCKS = """
import torch
from pathlib import Path
from ort_zero.zero3 import heap

MIB = 2**20

def rss():
    line = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024

torch.ones(24 * 2**20, dtype=torch.uint8)  # mmapped and freed at once: glibc's mmap threshold rises to 24 MiB
blocks = [torch.ones(4 * 2**20, dtype=torch.uint8) for _ in range(33)]  # 132 MiB from the heap, touched
held = rss()
del blocks[1::2]  # 64 MiB freed between blocks that stay: the heap cannot shrink
freed = rss()
heap.give_back_freed_memory()
print(held, freed, rss())
del blocks
"""


@pytest.mark.skipif(heap._malloc_trim() is None, reason="glibc only")
def test_what_the_heap_freed_leaves_rss() -> None:
    child = subprocess.run([sys.executable, "-c", FREED_BLOCKS], capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    held, freed, given_back = map(float, child.stdout.split())
    assert held - freed < 16, "glibc gave the blocks back by itself: the test proves nothing"
    assert freed - given_back > 48, f"the heap kept what the blocks freed: {held}, {freed}, {given_back} MiB"


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


def test_a_layer_trims_once_rss_has_grown(monkeypatch: pytest.MonkeyPatch) -> None:
    rss, trims = [0], []
    monkeypatch.setattr(heap, "_malloc_trim", lambda: trims.append)
    monkeypatch.setattr(heap, "rss_bytes", lambda: rss[0])
    monkeypatch.setattr(heap.MARK, "rss", 100 * MIB)
    for mib in (150, 90, 90 + 255, 90 + 256):  # a shrink lowers the mark: 346 MiB has grown by 256 since 90
        rss[0] = mib * MIB
        heap.give_back_if_grown()
    assert trims == [0] and heap.MARK.rss == 346 * MIB


def test_trim_heap_0_keeps_the_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    trims: list[int] = []
    monkeypatch.setattr(heap, "_malloc_trim", lambda: trims.append)
    heap.give_back_freed_memory()
    monkeypatch.setenv("ORT_ZERO_TRIM_HEAP", "0")
    heap.give_back_freed_memory()
    assert trims == [0]
