"""The export's trace records source ranges only where torch's ONNX passes compare them.

torch's tracer calls one callback per traced node, and torch's walks the whole Python stack and formats it into the
node's source range: at 162M parameters, seq 1024, about 1 s of a 2.3-s export (bf16 LLaMA, 2 CPU ranks, 2026-12-02).
ORT's graph keeps no source range (node names come from module scopes; `errors` names a failing module from its own
hooks), but torch's in-place passes read some: they group an indexing expression (`x[1:3, 0] = y`, `x[:, :n].copy_()`)
by comparing the ranges of a slice/select chain with the in-place node at its end, and dereference them (an export
where those nodes had none crashed with SIGSEGV, Qwen3.5's). ort_zero's C callback (`stack/csrc/trace_sources.cpp`)
calls torch's for aten::slice, aten::select, aten::index_put and the in-place aten ops, and records nothing for the
rest. Where the callback is not built or torch's cannot be read, the trace records as torch does.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from collections.abc import Iterator

from ...foreign import torch as torch_internals
from ...stack import trace_sources


@contextlib.contextmanager
def compared_source_ranges_only() -> Iterator[bool]:
    """For the block, the tracer records source ranges only for the nodes torch's ONNX passes compare; yields whether
    it does (else torch's callback stays)."""
    ours = _our_recorder()
    torchs = torch_internals.tracer_recorder()
    if ours is None or torchs is None or torchs == ours[1]:  # not built, not readable, or already installed
        yield False
        return
    library, address = ours
    library.ort_zero_set_torch_recorder(ctypes.c_void_p(torchs))
    torch_internals.set_tracer_recorder(address)
    try:
        yield True
    finally:
        torch_internals.set_tracer_recorder(torchs)


@functools.cache
def _our_recorder() -> tuple[ctypes.CDLL, int] | None:
    """ort_zero's built callback library and the address of its callback; None when it is not built."""
    built = trace_sources.library()
    if built is None:
        return None
    library = ctypes.CDLL(str(built))
    library.ort_zero_set_torch_recorder.argtypes, library.ort_zero_set_torch_recorder.restype = [ctypes.c_void_p], None
    return library, ctypes.cast(library.ort_zero_record_compared_sources, ctypes.c_void_p).value
