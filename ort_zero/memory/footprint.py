"""What ORTModule keeps once its training session exists, cut down to what it needs.

Measured with memray on the small GPT (16 blocks, rank 0 of 2, torch 2.6), everything the first step leaves besides the
session: the C++ graph builder (37 MiB), the graphs ORTModule keeps as protobufs (19.5 MiB held for 2.8 MiB
serialized: upb arenas never free what a rewrite replaced) and the session's copy of the model bytes (1.8 MiB).
(torch 2.6's exporter also kept 8 MiB of diagnostics per export; the TorchScript exporter of torch >= 2.9 keeps none.)
Freed small blocks of the export's garbage then stay in the heap (28 MiB that `malloc_trim` returns).

Every step leaves freed memory in glibc's heap too, more under ORT than in PyTorch: measured on a 162M LLaMA
(Trainer, 2 CPU ranks, ORT's arena on), RSS after a step fell by 1.2 GiB per rank with `malloc_trim` under ORT and by
0.75 GiB natively (live memory: 2.9 vs 2.5 GiB; ORT's arena is the difference). So after each forward and each
backward an ORT training session on CPU hands the heap's free pages back (`memory.heap`; `ORT_ZERO_TRIM_HEAP=0`
keeps them).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
from typing import Any

import onnx

from ..foreign import onnxruntime as ort_internals
from . import heap
from .output_pool import POOL as OUTPUT_POOL


def compacted(model: onnx.ModelProto) -> onnx.ModelProto:
    """A fresh parse of `model`, equal to it, in an arena holding only what it has now."""
    fresh = onnx.ModelProto()
    fresh.ParseFromString(model.SerializeToString())
    return fresh


def trim_training_manager(manager: Any) -> None:
    """Releases what a TrainingManager keeps beyond its needs, once its session is built.

    The linear layers' output pool learns that a first run comes. The graph builder goes: ORTModule makes a new
    one before every build (`_initialize_graph_builder` precedes each `_build_graph`). The graphs it compares and
    rebuilds from stay, compacted. The session's copy of the model bytes goes: ORT keeps it to rebuild an inference
    session after a provider failure, which a training agent never does.
    """
    ort_internals.release_kept(manager, compacted)
    OUTPUT_POOL.session_built()
    heap.give_back_freed_memory()  # an export leaves many free pages


def trim_after_each_backward(manager: Any) -> None:
    """ORTModule's autograd Function hands the heap's free pages back to the OS after each backward, once ORT has
    dropped the run's state (ORTModule deletes it as its backward ends). The state keeps the torch kernels' tensors of
    the forward: trimmed inside `TrainingAgent.run_backward`, before the state went, a 162M LLaMA at seq 2048
    (checkpointed, 2 CPU ranks) kept 1.2 GiB per rank more than after, as free heap beside which the first optimizer
    step then allocated its states: that step's peak was 5.9-6.0 GiB, now 5.0-5.1. Once per Function."""
    function = ort_internals.forward_function(manager)
    backward = function.backward
    if getattr(backward, "trims_heap", False):
        return

    def backward_then_trim(ctx: Any, *grad_outputs: Any) -> Any:
        grads = backward(ctx, *grad_outputs)
        OUTPUT_POOL.end_step()
        heap.give_back_freed_memory()
        return grads

    backward_then_trim.trims_heap = True  # type: ignore[attr-defined]
    function.backward = staticmethod(backward_then_trim)


def trimmed_after_forward(run_forward: Any) -> Any:
    """Wraps `TrainingAgent.run_forward`: the heap's free pages go back to the OS after each forward (sessions on
    CPU). The first forward (the export runs in it) leaves the export's garbage and ORT's first-run copies of the
    bridges' inputs: measured on a 162M LLaMA at seq 1024 (2 CPU ranks), 1.0 GiB per rank came back and the first
    step's peak fell from 5.5-5.6 to 5.1-5.2 GiB. Every later forward leaves what it computed and did not keep for the
    backward, most of a step's activations under the layer-wise recompute: with it, RSS at the forward's end fell from
    4.8 to 4.2 GiB per rank and the step's peak from 5.4-5.7 to 4.9-5.1 GiB, for 20 ms a step."""

    @functools.wraps(run_forward)
    def run_forward_then_trim(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = run_forward(self, *args, **kwargs)
        if ort_internals.agent_session(self).get_providers()[0] == "CPUExecutionProvider":
            heap.give_back_freed_memory()
        return result

    return run_forward_then_trim


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks "
                "fordblks keepcost".split()]  # fmt: skip


def malloced_bytes() -> int | None:
    """Bytes malloc has handed out and not had back, after a garbage collection (glibc: the main heap's in-use bytes
    plus mmapped blocks); None without glibc. How the tests measure what ORTModule keeps."""
    mallinfo2 = getattr(_libc(), "mallinfo2", None)
    if mallinfo2 is None:
        return None
    mallinfo2.restype = _Mallinfo2
    gc.collect()
    info = mallinfo2()
    return info.uordblks + info.hblkhd


@functools.cache
def _libc() -> Any:
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name) if name else None
