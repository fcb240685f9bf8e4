"""What glibc's heap freed, back to the system (`malloc_trim`; elsewhere nothing): at a layer's boundary once RSS
has grown (below), after each ORT forward and backward on CPU and once an ORT session is built
(`memory.footprint`, which says what those hold). ORT_ZERO_TRIM_HEAP=0 keeps it all (`settings.trim_heap`).

glibc serves allocations below its mmap threshold from its heaps, and that threshold rises with the largest block
freed so far, to 32 MiB: a layer's gathered weights and, at long sequences, its activations (6-24 MiB per tensor
at seq 2048, hidden 768) then come from the heap, which keeps what they free unless it lies at the heap's top.
Measured (LLaMA 4 layers, hidden 768, seq 2048, checkpointed, 2 ranks, ORT): RSS rose by ~200 MiB per layer through
the forward while the bytes malloc had handed out stayed flat, a step's peak 4.05-4.10 GiB; trimmed after each
layer's forward and before its backward, 3.50-3.58 GiB, the same step time. A trim costs its call and the page
faults that bring the pages back: at seq 128, trimming at every layer made a 162M LLaMA's step 7% slower (3.9 to
4.2 s) for 0.1-0.2 GiB, so a layer trims only once RSS has grown by `LAYER_TRIM_GROWTH` since the last trim: then
3.9 s at seq 128 (3 layer trims a step), and at seq 2048 checkpointed step peaks of 5.16-5.29 GiB (every layer:
5.07-5.27; none: 6.34-6.41).
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass

from .. import settings

LAYER_TRIM_GROWTH = 256 * 2**20
"""Bytes RSS must have grown by since the last trim for a layer's boundary to trim."""
_PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass
class TrimMark:
    """RSS after the last trim, lowered when RSS falls below it: what a layer's boundary measures growth from."""

    rss: int = 0

    def grown_by_enough(self, rss: int) -> bool:
        self.rss = min(self.rss, rss)
        return rss - self.rss >= LAYER_TRIM_GROWTH


MARK = TrimMark()
"""The process's one mark: glibc's heaps are the process's."""


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim
    except AttributeError:  # not glibc
        return None


def rss_bytes() -> int:
    with open("/proc/self/statm", "rb") as statm:
        return int(statm.read().split()[1]) * _PAGE


def give_back_freed_memory() -> None:
    """Return the free pages of every glibc heap to the system, unless ORT_ZERO_TRIM_HEAP=0."""
    if (trim := _malloc_trim()) is not None and settings.trim_heap():
        trim(0)
        MARK.rss = rss_bytes()


def give_back_if_grown() -> None:
    """At a layer's boundary: `give_back_freed_memory` once RSS has grown by `LAYER_TRIM_GROWTH` since the last."""
    if _malloc_trim() is not None and MARK.grown_by_enough(rss_bytes()):
        give_back_freed_memory()
