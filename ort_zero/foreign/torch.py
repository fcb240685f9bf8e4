"""torch's internals that ort_zero reads (torch `versions.TORCH_VERSIONS`).

Read: `torch._C._construct_storage_from_data_pointer` (a storage over memory it does not own), a module's
`_backward_hooks`, and the private module `torch.utils._pytree` (the nested-structure walker FSDP2 uses too). The
exporter's private modules ORTModule imports are `ort_zero.patches`' (torch_onnx group).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree  # noqa: F401  (re-exported: ort_zero.hooks.nested walks with it)


def unowned_storage(data_ptr: int, device: torch.device, nbytes: int) -> torch.UntypedStorage:
    """A storage over `nbytes` at `data_ptr` that does not keep the memory alive."""
    return torch._C._construct_storage_from_data_pointer(data_ptr, device, nbytes)


def full_backward_hooks(module: torch.nn.Module) -> list[Callable[..., Any]]:
    """The backward hooks registered on `module` (`register_full_backward_hook`)."""
    return list(module._backward_hooks.values())
