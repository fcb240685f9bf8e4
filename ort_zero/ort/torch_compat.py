"""What ORTModule 1.19.2 expects of `torch.onnx` and newer torch no longer gives it (declared in `ort_zero.patches`).

From torch 2.9 the TorchScript exporter's private modules live under `torch.onnx._internal.torchscript_exporter`,
and `torch.onnx.export` exports with dynamo unless told otherwise. ORTModule imports the old paths and exports
through TorchScript (PythonOps exist only there), so the old names point at the moved modules, and while ORTModule
exports, `torch.onnx.export` defaults to `dynamo=False`.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

TORCHSCRIPT_EXPORTER = "torch.onnx._internal.torchscript_exporter"


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


def torchscript_export(export: Any) -> Any:
    """`torch.onnx.export` with dynamo off unless the caller chose."""

    @functools.wraps(export)
    def export_with_torchscript(*args: Any, dynamo: bool = False, **kwargs: Any) -> Any:
        return export(*args, dynamo=dynamo, **kwargs)

    return export_with_torchscript


def exporting_with_torchscript(original: staticmethod) -> staticmethod:
    """Wraps ORTModule's export (a staticmethod) so that `torch.onnx.export` is the TorchScript one while it runs."""
    from .. import patches

    @functools.wraps(original.__func__)
    def get_exported_model(*args: Any, **kwargs: Any) -> Any:
        with patches.applied("torchscript_export"):
            return original.__func__(*args, **kwargs)

    return staticmethod(get_exported_model)
