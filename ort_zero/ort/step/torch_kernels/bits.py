"""Whether two tensors hold the same bits, asked on the kernels' hot path: whether a kept copy is still the input ORT
hands over (`linear._SharedCopy`), whether a mask is the causal one (`attention.is_causal_mask`).

`torch.equal` compares element by element, and on CPU its loop is not vectorized for bf16 or bool: a bool [2048, 2048]
mask took 4.4 ms, a bf16 [2048, 768] input 2.5 ms, [2048, 3072] 9.1 ms; as 64-bit words 0.7, 0.5 and 2.9 ms (one
thread; docs/benchmarks.md). Bits are also what these questions ask: a copy is the input only if every bit is (a -0.0
where the input has 0.0 is not), and a NaN there is itself."""

from __future__ import annotations

import torch

_WORD_BYTES = 8
_INTEGER_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether `a` and `b` have one shape, dtype and device and the same bits."""
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return False
    if torch.jit.is_tracing():  # the trace records what runs, and the exporter has no op for a dtype's view
        return torch.equal(a, b)
    words_a, words_b = _as_words(a), _as_words(b)
    if words_a is not None and words_b is not None:
        return torch.equal(words_a, words_b)
    return torch.equal(_as_integers(a), _as_integers(b))


def _as_words(tensor: torch.Tensor) -> torch.Tensor | None:
    """A dense tensor's bytes as 64-bit words, or None where they do not divide into whole aligned words."""
    size = tensor.element_size()
    whole_words = tensor.numel() * size % _WORD_BYTES == 0 and tensor.storage_offset() * size % _WORD_BYTES == 0
    if not (tensor.is_contiguous() and whole_words):
        return None
    return tensor.reshape(-1).view(torch.int64)


def _as_integers(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's elements as integers of their size (any layout), so `torch.equal` compares bits."""
    integer = _INTEGER_OF_SIZE.get(tensor.element_size())
    return tensor if integer is None else tensor.view(integer)
