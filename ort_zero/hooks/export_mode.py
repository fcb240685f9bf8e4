"""Whether the model is being traced for export rather than run.

Hooks must not advance steps and ZeRO-3 bridges must not run collectives while a tracer is running: the ONNX
exporter's own trace (`torch.onnx.is_in_onnx_export`) and any forward run only to learn shapes before it
(ORTModule runs one to read the output schema), which the ORT layer marks with `exporting()`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

_state = threading.local()


def is_exporting() -> bool:
    return getattr(_state, "depth", 0) > 0 or torch.onnx.is_in_onnx_export()


@contextlib.contextmanager
def exporting() -> Iterator[None]:
    _state.depth = getattr(_state, "depth", 0) + 1
    try:
        yield
    finally:
        _state.depth -= 1
