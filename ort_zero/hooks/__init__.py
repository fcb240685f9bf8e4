"""Module-hook framework: subscribers, the manager that installs them, and nested-structure flattening.

Knows neither DeepSpeed nor ONNX Runtime; everything else in ort_zero builds on it.
"""

from .export_mode import exporting, is_exporting
from .manager import SubscriberManager
from .nested import Flat, flatten, map_tensors
from .subscriber import RunContext, SubscriberBase

__all__ = [
    "Flat",
    "RunContext",
    "SubscriberBase",
    "SubscriberManager",
    "exporting",
    "flatten",
    "is_exporting",
    "map_tensors",
]
