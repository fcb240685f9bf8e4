"""What has to happen before ONNX Runtime's modules run, done when ONNX Runtime is first imported.

`import ort_zero` only registers a finder for the `onnxruntime` package. When ORT is first imported (or when
`enable_zero3()` runs, whichever comes first), ORT's import-time notes that no user of ort_zero needs are filtered
(`ort.console.quiet_imports`), torch.onnx gets back the names ORTModule imports (the "torch_onnx" patches) and, on a
GPU host, ORT's CUDA 11 libraries are preloaded (`stack.cuda_libraries.make_findable`). Once `onnxruntime` has been
imported, ORT's own switch ORTMODULE_ENABLE_ZERO_STAGE3=1 enables ort_zero (the `then` of `install`).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from . import patch_groups, patches
from .ort.ortmodule.console import quiet_imports
from .stack.cuda_libraries import make_findable

ORT_PACKAGE = "onnxruntime"


@functools.cache
def prepare_for_ort() -> None:
    """Everything ORT's modules need from ort_zero before they run; once per process."""
    quiet_imports()
    patches.apply_group(patch_groups.TORCH_ONNX)
    make_findable()


class _BeforeOrt(importlib.abc.MetaPathFinder):
    """Prepares for ORT when the `onnxruntime` package is looked for; once its loader has run, `then`."""

    def __init__(self) -> None:
        self.then: Callable[[], None] = lambda: None

    def find_spec(self, name: str, path: Any = None, target: ModuleType | None = None) -> Any:
        if name != ORT_PACKAGE:
            return None
        prepare_for_ort()
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _LoadThen(spec.loader, self.then)
        return spec


class _LoadThen(importlib.abc.Loader):
    """ORT's own loader, then `then`; the module keeps ORT's loader."""

    def __init__(self, loader: importlib.abc.Loader, then: Callable[[], None]) -> None:
        self.loader, self.then = loader, then

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        uninstall()
        module.__loader__ = module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        self.then()


_FINDER = _BeforeOrt()


def install(then: Callable[[], None]) -> None:
    """Called by `import ort_zero`: prepare when ORT is first imported, and `then` once it is (both at once if it
    already was)."""
    _FINDER.then = then
    if ORT_PACKAGE in sys.modules:
        prepare_for_ort()
        then()
    elif _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def uninstall() -> None:
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
