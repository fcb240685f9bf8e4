"""The patch groups that apply only while ORTModule exports a ZeRO-3 model, and the context that applies them.

Their patches are declared in `ort_zero.patches.export` (what each replaces, why, for which versions); this module
says which groups an export enters: the always-on ones, transformers' experts where its MoE code is loaded, and the
rewrites of the modeling files the model's modules come from.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import torch

from ...patching import applied
from . import rewrites

ORT_EXPORT = "ort_export"
PYTHON_OPS = "export_python_ops"
TORCH_KERNELS = "torch_kernels"
TORCH_EXPERTS = "torch_kernels_experts"
AUTOGRAD_FUNCTIONS = "export_autograd_functions"


@contextlib.contextmanager
def during_export(module: torch.nn.Module) -> Iterator[None]:
    """The export-time groups, applied while `module` is exported (or its output schema read)."""
    with contextlib.ExitStack() as stack:
        for group in (ORT_EXPORT, AUTOGRAD_FUNCTIONS, PYTHON_OPS, TORCH_KERNELS):
            stack.enter_context(applied(group))
        if "transformers.integrations.moe" in sys.modules:  # a model of transformers' experts may be exported
            stack.enter_context(applied(TORCH_EXPERTS))
        for group in rewrites.groups_for(module):
            stack.enter_context(applied(group))
        yield
