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

from ...patch_groups import (
    EXPORT_AUTOGRAD_FUNCTIONS,
    EXPORT_PYTHON_OPS,
    ORT_EXPORT,
    TORCH_KERNELS,
    TORCH_KERNELS_EXPERTS,
)
from ...patching import applied
from . import rewrites


@contextlib.contextmanager
def during_export(module: torch.nn.Module) -> Iterator[None]:
    """The export-time groups, applied while `module` is exported (or its output schema read)."""
    with contextlib.ExitStack() as stack:
        for group in (ORT_EXPORT, EXPORT_AUTOGRAD_FUNCTIONS, EXPORT_PYTHON_OPS, TORCH_KERNELS):
            stack.enter_context(applied(group))
        if "transformers.integrations.moe" in sys.modules:  # a model of transformers' experts may be exported
            stack.enter_context(applied(TORCH_KERNELS_EXPERTS))
        for group in rewrites.groups_for(module):
            stack.enter_context(applied(group))
        yield
