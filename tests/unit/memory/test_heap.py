"""The heap gives back what it freed (`ort_zero.memory.heap`), once RSS has grown since the last time (a model's
layers ask it to at their boundaries: tests/unit/zero3/test_layer_trims.py). What it saves at real size is measured in
docs/benchmarks.md; here, that freed heap memory leaves RSS, which glibc alone does not do."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ort_zero.memory import heap

MIB = 2**20

# In a fresh process, so that the heap is laid out as the script says. Prints RSS (MiB) with the blocks, after
# freeing them, after the heap gave back.
FREED_BLOCKS = """
import torch
from pathlib import Path
from ort_zero.memory import heap

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
