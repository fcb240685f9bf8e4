"""The one way ort_zero declares a replacement: a name, the target it replaces, why, the model types that need it
(none: every model), and the factory that makes the replacement from what it replaces.

Every kind is one of these: a monkey patch (`patching.Patch` adds the versions that guard it), an op's export
override (`ort.export.overrides`: target "aten::op", the factory makes the symbolic from ORT's own), a torch op run
in a PythonOp (`ort.export.python_ops`), a model rewrite (`ort.export.rewrites`: one per symbol it replaces) and a
gradient ORT lacks (`ort.export.gradients`: target "domain::OpType", the factory makes ORT's gradient notation).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Declaration:
    name: str
    # what is replaced: "package.module.attribute", "package.module:Class.attribute", "aten::op", "domain::OpType"
    target: str
    reason: str
    factory: Callable[[Any], Any]  # what it replaces (None where there is nothing) -> what runs instead
    needed_by: tuple[str, ...] = ()  # the model types measured to need it; () for every model

    def owner_and_attribute(self) -> tuple[str, str]:
        """A symbol's owner ("module" or "module:Class") and the attribute replaced on it."""
        owner, dot, attribute = self.target.rpartition(".")
        if not dot or "::" in self.target:
            raise ValueError(f"declaration '{self.name}': '{self.target}' names no attribute of a module or class")
        return owner, attribute

    def domain_and_op(self) -> tuple[str, str]:
        """An op's domain and type, from "domain::op" ("onnx" being ONNX's default domain, "")."""
        domain, separator, op = self.target.partition("::")
        if not separator:
            raise ValueError(f"declaration '{self.name}': '{self.target}' names no op (domain::op)")
        return ("" if domain == "onnx" else domain), op
