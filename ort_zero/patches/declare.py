"""How a patch is declared: one helper per package it replaces code of, each with that package's tested versions, and
factories imported only when their patch applies (`deferred`), so that importing the declarations imports neither
DeepSpeed nor ONNX Runtime."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ..declaration import Declaration
from ..foreign.fingerprints import TESTED_SOURCES
from ..foreign.versions import DEEPSPEED_VERSIONS, ORT_VERSIONS, TORCH_VERSIONS, TRANSFORMERS_VERSIONS
from ..patching import Patch, register

ORTM = "onnxruntime.training.ortmodule"
GTM = f"{ORTM}._graph_transition_manager"
GEM = f"{ORTM}._graph_execution_manager:GraphExecutionManager"
IO = f"{ORTM}._io"


def deferred(load: Callable[[], Callable[[Any], Any]]) -> Callable[[Any], Any]:
    """A replacement factory imported when its patch applies: `load` returns it."""

    def make(replaced: Any) -> Any:
        return load()(replaced)

    return make


def ort_zero_module(name: str) -> ModuleType:
    """An ort_zero module (`name` below the package, "zero3.saving"), imported when a patch that needs it applies: its
    code imports DeepSpeed or ONNX Runtime. tests/unit/test_patches.py builds every replacement, so a wrong name fails
    there."""
    return importlib.import_module(f"ort_zero.{name}")


def declared(group: str, declaration: Declaration) -> None:
    """A declaration of a symbol in torch or transformers (by its target), guarded by that package's tested
    versions; transformers' model code still applies outside them where it is unchanged (`TESTED_SOURCES`)."""
    if declaration.target.startswith("transformers"):
        fingerprints = TESTED_SOURCES.get(declaration.name, ())
        register(Patch(declaration, "transformers", TRANSFORMERS_VERSIONS, fingerprints=fingerprints), group)
    else:
        register(Patch(declaration, "torch", TORCH_VERSIONS), group)


def torch_patch(
    group: str, name: str, owner: str, attribute: str, reason: str, factory: Any, adds: bool = False
) -> None:
    declaration = Declaration(name, f"{owner}.{attribute}", reason, factory)
    register(Patch(declaration, "torch", TORCH_VERSIONS, adds=adds), group)


def deepspeed_patch(group: str, name: str, owner: str, attribute: str, reason: str, factory: Any) -> None:
    register(Patch(Declaration(name, f"{owner}.{attribute}", reason, factory), "deepspeed", DEEPSPEED_VERSIONS), group)


def transformers_patch(
    group: str, name: str, owner: str, attribute: str, reason: str, factory: Any, needed_by: tuple[str, ...]
) -> None:
    """A patch of transformers' model code: outside the tested versions it applies where that code is unchanged."""
    declared(group, Declaration(name, f"{owner}.{attribute}", reason, factory, needed_by))


def ort_patch(
    group: str,
    name: str,
    owner: str,
    attribute: str,
    reason: str,
    factory: Any,
    registers: tuple[Declaration, ...] = (),
) -> None:
    declaration = Declaration(name, f"{owner}.{attribute}", reason, factory)
    register(Patch(declaration, "onnxruntime-training", ORT_VERSIONS, registers=registers), group)
