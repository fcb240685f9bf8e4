"""ort_zero: DeepSpeed ZeRO-3 for models that run in ONNX Runtime through ORTModule.

import ort_zero
ort_zero.enable_zero3()                  # before deepspeed.initialize
model = ORTModule(model)                 # optional: without it the same hooks run in PyTorch
engine, *_ = deepspeed.initialize(model=model, config=...)
"""

from __future__ import annotations

from . import patches
from .api import disable_zero3, enable_from_environment, enable_mem_efficient_grads, enable_zero3, is_zero3_enabled
from .ort.console import quiet_imports
from .stack.cuda_libraries import make_findable

__version__ = "0.1.0"
__all__ = ["disable_zero3", "enable_mem_efficient_grads", "enable_zero3", "is_zero3_enabled"]

quiet_imports()  # notes that importing ORT causes and no user of ort_zero needs
patches.apply_group("torch_onnx")  # ORTModule imports torch.onnx modules by their pre-2.9 names
make_findable()  # on GPU hosts: ORT's CUDA 11 libraries, before any ORT session loads its CUDA provider
enable_from_environment()
