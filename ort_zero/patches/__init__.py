"""The one registry of symbols ort_zero replaces in torch, DeepSpeed, transformers, ONNX Runtime and TRL.

Every monkey patch in the package is declared in this package, one module per place it acts (`torch_onnx`: ORTModule
importable on today's torch; `zero3`: DeepSpeed's engine; `ort`: ORTModule's export, session and console;
`export`: what is replaced only while a ZeRO-3 model is exported; `trl`), with what it replaces, why and for which
versions (`declare`). The only other code in ort_zero that reads another package's private names or writes into its
objects is `ort_zero.foreign` (tests/unit/foreign checks that nothing else reaches). How patches are applied and
reverted (by name, in groups, restoring the original object exactly) is `ort_zero.patching`; its API is used through
this package. Every factory is referenced by its name in code (a module whose code imports DeepSpeed or ONNX Runtime
is imported when its patch applies, `declare.ort_zero_module`), and tests/unit/test_patches.py builds every
replacement against the installed stack, so a rename fails there.
"""

from __future__ import annotations

from ..patching import (
    Patch,
    UnsupportedVersionError,
    applied,
    apply_group,
    fingerprint,
    groups,
    is_applied,
    original,
    register,
    registered,
    revert_group,
)
from . import export, ort, torch_onnx, trl, zero3

__all__ = [
    "Patch", "UnsupportedVersionError", "applied", "apply_group", "export", "fingerprint", "groups",
    "is_applied", "original", "ort", "register", "registered", "revert_group", "torch_onnx", "trl", "zero3",
]  # fmt: skip
