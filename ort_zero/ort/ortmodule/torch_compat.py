"""What ORTModule 1.19.2 expects of `torch.onnx` and newer torch no longer gives it (declared in `ort_zero.patches`).

From torch 2.9 the TorchScript exporter's private modules live under `torch.onnx._internal.torchscript_exporter`,
and `torch.onnx.export` exports with dynamo unless told otherwise. ORTModule imports the old paths and exports
through TorchScript (PythonOps exist only there), so the old names point at the moved modules, and called from ORT,
`torch.onnx.export` defaults to `dynamo=False`. That route is deprecated in torch (since 2.10): said once by
`ort-zero doctor`, not by every export, which also keeps the tracer's notes on the model's Python control flow
(TracerWarning: the graph is checked against PyTorch's numbers, not the trace's guesses) to itself.
"""

from __future__ import annotations

import functools
import importlib
import sys
import warnings
from collections.abc import Callable
from typing import Any

import torch

TORCHSCRIPT_EXPORTER = "torch.onnx._internal.torchscript_exporter"
# What torch's TorchScript exporter says of itself on every export ORT makes (torch 2.14): the route, ORT's
# `training=` argument and the mode-selection helper it runs are deprecated.
EXPORTER_DEPRECATIONS = (
    "You are using the legacy TorchScript-based ONNX export",
    "Setting `training` to something other than default is deprecated",
    "The feature will be removed. Please remove usage of this function",
)


def moved_module(name: str) -> Any:
    """A replacement factory: the module `name` now has under the TorchScript exporter's package."""

    def replacement(_absent: Any) -> Any:
        return importlib.import_module(f"{TORCHSCRIPT_EXPORTER}.{name}")

    return replacement


def moved_function(module: str, name: str) -> Any:
    """A replacement factory: `module.name` of the TorchScript exporter (dropped from torch.onnx's shim)."""

    def replacement(_absent: Any) -> Any:
        return getattr(importlib.import_module(f"{TORCHSCRIPT_EXPORTER}.{module}"), name)

    return replacement


def torchscript_export_for_ort(export: Any) -> Any:
    """`torch.onnx.export`, with dynamo off unless chosen when ONNX Runtime's own code calls it.

    Told by the calling frame's module, since ORT calls it from several places (ORTModule's export, its
    hierarchical and gradient-graph tools) and all of them need the TorchScript exporter."""

    @functools.wraps(export)
    def export_for_ort(*args: Any, **kwargs: Any) -> Any:
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if not caller.startswith("onnxruntime."):
            return export(*args, **kwargs)
        return torchscript_export(export, *args, **kwargs)

    return export_for_ort


def torchscript_export(export: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`export(*args, **kwargs)` (torch.onnx.export) through the TorchScript exporter, its deprecation notes and the
    tracer's warnings kept to themselves: how ORTModule's exports, ORT's and ort_zero's, call it."""
    kwargs.setdefault("dynamo", False)
    with warnings.catch_warnings():
        for message in EXPORTER_DEPRECATIONS:
            warnings.filterwarnings("ignore", message=message, category=DeprecationWarning)
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        return export(*args, **kwargs)
