"""Export failures that say where and what to do.

The exporter's own messages name an op, rarely the module. While ORTModule exports, global module hooks keep the
stack of running modules and a torch-function mode notes which module first called each function; if the export
raises (while tracing, or later while converting an op such as `aten::linalg_eigh`), the error names the module and
the ways out.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.overrides import TorchFunctionMode

# ORTModule's wrappers around the user's model: not useful in a module path.
_WRAPPER_PREFIXES = ("_torch_module.", "_flattened_module.", "_original_module.", "module.")


class ExportFailure(RuntimeError):
    """ORTModule could not export the model; the message names the module and the way out."""


def unwrapped(path: str) -> str:
    """A module or parameter path as the user's model names it, without the wrappers' prefixes."""
    stripped = True
    while stripped:
        stripped = False
        for prefix in _WRAPPER_PREFIXES:
            if path.startswith(prefix):
                path, stripped = path[len(prefix) :], True
    return path


def readable(path: str) -> str:
    return unwrapped(path) or "<root>"


@contextlib.contextmanager
def naming_export_failures(root: torch.nn.Module) -> Iterator[None]:
    names = {module: readable(name) for name, module in root.named_modules()}
    running: list[torch.nn.Module] = []

    def enter(module: torch.nn.Module, args: tuple) -> None:
        if module in names:
            running.append(module)

    def leave(module: torch.nn.Module, args: tuple, output: object) -> None:
        if running and running[-1] is module:
            running.pop()

    handles = [register_module_forward_pre_hook(enter), register_module_forward_hook(leave)]
    callers = _FirstCaller(running)
    try:
        with callers:
            yield
    except Exception as error:
        where = running[-1] if running else callers.module_for(str(error)) or root
        raise ExportFailure(
            f"ort_zero: exporting the model to ONNX failed in module '{names.get(where, '<root>')}' "
            f"({type(where).__name__}): {type(error).__name__}: {error}\n"
            "Ways out: make that module's forward exportable (tensor ops with ONNX equivalents, no data-dependent "
            "Python control flow); or wrap the unsupported part in a torch.autograd.Function (ORTModule runs it as "
            "a PythonOp in PyTorch); or leave this model out of ORTModule. Fallback to PyTorch is off under "
            "ort_zero unless ORTMODULE_FALLBACK_POLICY asks for it."
        ) from error
    finally:
        for handle in handles:
            handle.remove()


class _FirstCaller(TorchFunctionMode):
    """Remembers, for each torch function name, the module that first called it during the trace."""

    def __init__(self, running: list[torch.nn.Module]) -> None:
        super().__init__()
        self.running = running
        self.first: dict[str, torch.nn.Module] = {}

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if self.running:
            self.first.setdefault(getattr(func, "__name__", ""), self.running[-1])
        return func(*args, **(kwargs or {}))

    def module_for(self, message: str) -> torch.nn.Module | None:
        match = re.search(r"aten::(\w+)", message)
        return self.first.get(match.group(1)) if match else None
