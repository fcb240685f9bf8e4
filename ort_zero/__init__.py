"""ort_zero: DeepSpeed ZeRO-3 for models that run in ONNX Runtime through ORTModule.

import ort_zero
ort_zero.enable_zero3()                  # before deepspeed.initialize
model = ORTModule(model)                 # optional: without it the same hooks run in PyTorch
engine, *_ = deepspeed.initialize(model=model, config=...)
"""

from __future__ import annotations

from . import ort_import
from .api import disable_zero3, enable_from_environment, enable_mem_efficient_grads, enable_zero3, is_zero3_enabled

__version__ = "0.1.0"
__all__ = ["disable_zero3", "enable_mem_efficient_grads", "enable_zero3", "is_zero3_enabled"]

ort_import.install(then=enable_from_environment)  # nothing else happens at import: ort_zero/ort_import.py
