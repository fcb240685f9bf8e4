"""DeepSpeed ZeRO-3 through ort_zero's hooks: per-module state, bridges, the subscriber and its installation.

Works without ONNX Runtime: the same bridges run in plain PyTorch.
"""

from .bridges import BRIDGES, PostForwardBridge, PreForwardBridge, StepStartBridge
from .subscriber import ZeROOffloadSubscriber

__all__ = ["BRIDGES", "PostForwardBridge", "PreForwardBridge", "StepStartBridge", "ZeROOffloadSubscriber"]
