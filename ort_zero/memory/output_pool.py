"""CPU buffers the linear layers (and a 16-bit model's SiLU, products, sums and norms) write into, kept step to step.

On CPU every step's activations are freed after the backward and handed back to the OS (`memory.heap`), and the next
forward faults them in again, page by page: at seq 1024 on a 162M LLaMA that was 1.3 GiB a step, the system time that
made ORT's step 1.16-1.20x native's. The linear layers' outputs (and their input gradients) are most of those bytes and
have the same sizes every step, so `LinearInTorch` takes them from this pool, and the copies of its inputs it keeps for
the weight's gradient: a buffer is handed out again once nothing but the pool holds its storage (ORT has released the
tensor, or the backward its copy), so its pages stay resident and are not faulted again. Sizes are matched by capacity,
so a shorter batch reuses a longer one's buffer; a buffer a whole step did not use is dropped at that step's end
(`end_step`), so changing shapes cannot grow the pool. A new session's first run is not a step's pattern: it held 89
buffers (614 MiB) at once where each later step needed 29 (434 MiB; 162M LLaMA, seq 1024), and kept through the second
step those lifted its peak by ~350 MiB at seq 2048; so what the pool holds after a first run is dropped. The LM head's
logits are pooled too, though glibc maps so large a block on its own: left to torch, a step at seq 2048 took 1.06x
native's instead of 0.98x (its system time 4.5-4.8 s against 3.4-3.7).
A bf16 model's too: once its step peaked in DeepSpeed's optimizer step, through which the buffers stay resident
(342 MiB at seq 1024 lifted ORT's peak from 0.92x native's to 0.99x), and 16-bit outputs stayed out. Measured again
(83bea7b), a 162M LLaMA's bf16 step peaks in the forward, and the buffers lift the optimizer step's RSS only to that
peak: with them a step at seq 1024 took 15.4 s instead of 16.9 (forward page faults 340 thousand instead of 460) at
the same peak; at seq 2048, 33.3 s instead of 34.5 (docs/benchmarks.md).
ORT_ZERO_OUTPUT_POOL=0 turns it off (`settings.output_pool`).
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
from dataclasses import dataclass, field

import torch

from .. import settings
from ..foreign import torch as torch_internals
from ..hooks.export_mode import is_exporting

_UNSHARED = 2
"""A storage's use count when only the pool holds it: the pool's tensor and the storage object the buffer keeps."""


@dataclass(eq=False)
class _Buffer:
    """A pool tensor and its storage object, kept so that asking whether anything else holds the storage is one
    call: making a storage object per question, of every buffer at every take, was most of `take`'s time (a bf16
    162M LLaMA at seq 1024, 726 takes a step: 0.40-0.50 s a step, 0.81 s in the first; with the storage kept and only
    the buffers of fitting sizes asked, 0.23-0.28 s and 0.42 s, measured 2026-12-02)."""

    tensor: torch.Tensor
    used: bool = True
    storage: torch.UntypedStorage = field(init=False)

    def __post_init__(self) -> None:
        self.storage = self.tensor.untyped_storage()

    def is_free(self) -> bool:
        return torch_internals.storage_object_use_count(self.storage) == _UNSHARED

    @property
    def capacity(self) -> int:
        return self.tensor.numel()


_BY_CAPACITY = operator.attrgetter("capacity")
"""The key the buffers are sorted and searched by (`bisect`)."""


@dataclass
class OutputPool:
    """The process's buffers by dtype, smallest first; `take` hands out the smallest free one at least as large (at
    most twice: a small output never pins a large buffer), or a new one that replaces the largest free smaller one:
    lengths that change from batch to batch keep one buffer per size octave at most, without a step's end (ORT's
    inference runs). Only the buffers of the sizes that could serve are asked whether they are free."""

    buffers: dict[torch.dtype, list[_Buffer]] = field(default_factory=dict)
    first_run: bool = False

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        size = math.prod(shape)
        buffers = self.buffers.setdefault(dtype, [])
        first_fitting = bisect.bisect_left(buffers, size, key=_BY_CAPACITY)
        fitting = itertools.takewhile(lambda b: b.capacity < 2 * size, buffers[first_fitting:])
        buffer = next((b for b in fitting if b.is_free()), None)
        if buffer is None:
            smaller = next((b for b in reversed(buffers[:first_fitting]) if b.is_free()), None)
            if smaller is not None:  # a shorter batch's buffer, most often: replaced, not kept beside the new one
                buffers.remove(smaller)
            buffer = _Buffer(torch.empty(size, dtype=dtype))
            bisect.insort(buffers, buffer, key=_BY_CAPACITY)
        buffer.used = True
        return buffer.tensor[:size].view(shape)

    def session_built(self) -> None:
        """An ORT session is about to make its first run: what it takes is dropped at its end."""
        self.first_run = True

    def end_step(self) -> None:
        """At a step's end: drop the free buffers the step did not take (after a first run: all of them); the rest
        start the next step unused."""
        for dtype, buffers in self.buffers.items():
            self.buffers[dtype] = [b for b in buffers if (b.used and not self.first_run) or not b.is_free()]
            for buffer in self.buffers[dtype]:
                buffer.used = False
        self.first_run = False

    def bytes(self) -> int:
        return sum(b.capacity * b.tensor.element_size() for buffers in self.buffers.values() for b in buffers)


POOL = OutputPool()
"""The process's one pool: ORT runs one training step at a time."""


def pooled(
    shape: tuple[int, ...], like: torch.Tensor, *operands: torch.Tensor, dtype: torch.dtype | None = None
) -> torch.Tensor | None:
    """A pool buffer of `shape` for a kernel's output on `like`'s device, in `dtype` (default `like`'s), or None
    where torch should allocate: off the CPU, under autocast, for operands of mixed dtypes, with the pool off, or in
    the export's trace (whose outputs are garbage once it ends)."""
    if like.device.type != "cpu" or torch.is_autocast_enabled("cpu") or is_exporting():
        return None
    if not settings.output_pool():
        return None
    if any(t.dtype != like.dtype or t.device != like.device for t in operands):
        return None
    return POOL.take(shape, dtype or like.dtype)


def pooled_copy(tensor: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A copy of `tensor` (in `dtype`) in a pool buffer where the pool serves, else torch's."""
    buffer = pooled(tuple(tensor.shape), tensor, dtype=dtype)
    if buffer is None:
        return tensor.detach().to(dtype or tensor.dtype, copy=True, memory_format=torch.contiguous_format)
    return buffer.copy_(tensor.detach())
