"""Whether the model is being traced for export rather than run.

Hooks must not advance steps and ZeRO-3 bridges must not run collectives while a tracer is running: the ONNX
exporter's own trace (`torch.onnx.is_in_onnx_export`) and any forward run only to learn shapes before it
(ORTModule runs one to read the output schema), which the ORT layer marks with `exporting()`. While a ZeRO-3 model
is exported its partitioned parameters are stand-ins, views of buffers of zeros (`ort.export.context`): the code
that also runs inside ORT's graph at step time asks `is_stand_in` to skip what zeros make zeros while it is traced.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

_state = threading.local()  # how deep the running thread is in `exporting()`: a thread traces its own model
_STAND_IN_BUFFERS: set[int] = set()  # data pointers of the buffers of the exports running now (any thread's)


def is_exporting() -> bool:
    return getattr(_state, "depth", 0) > 0 or torch.onnx.is_in_onnx_export()


@contextlib.contextmanager
def exporting() -> Iterator[None]:
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        yield
    finally:
        _state.depth -= 1


@contextlib.contextmanager
def standing_in(buffers: list[torch.Tensor]) -> Iterator[None]:
    """While it lasts, the views of `buffers` are an export's stand-ins (`is_stand_in`)."""
    pointers = {buffer.untyped_storage().data_ptr() for buffer in buffers}
    _STAND_IN_BUFFERS.update(pointers)
    try:
        yield
    finally:
        _STAND_IN_BUFFERS.difference_update(pointers)


def is_stand_in(tensor: torch.Tensor) -> bool:
    """A stand-in, or a detached alias of one (the exporter detaches its parameters)."""
    return tensor.untyped_storage().data_ptr() in _STAND_IN_BUFFERS
