"""The one flatten/unflatten facility for nested module inputs and outputs.

Hooks see arbitrary structures (tuples, lists, dicts, dataclasses, Hugging Face `ModelOutput`, None, ints...) but
bridges and graph passes work on flat tensor lists. `torch.utils._pytree` does the walking (as FSDP2 does);
dataclasses that are not yet known to pytree are registered on first sight, so user-defined output classes work too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from ..foreign.torch import pytree


@dataclasses.dataclass(frozen=True)
class Flat:
    """A structure taken apart: its tensors in order, and what is needed to put it back together."""

    tensors: list[torch.Tensor]
    leaves: list[Any]
    tensor_positions: list[int]
    spec: pytree.TreeSpec

    def rebuild(self, tensors: list[torch.Tensor] | tuple[torch.Tensor, ...]) -> Any:
        """The original structure with its tensors replaced, in order, by `tensors`."""
        if len(tensors) != len(self.tensor_positions):
            raise ValueError(f"expected {len(self.tensor_positions)} tensors to rebuild, got {len(tensors)}")
        leaves = list(self.leaves)
        for position, tensor in zip(self.tensor_positions, tensors, strict=True):
            leaves[position] = tensor
        return pytree.tree_unflatten(leaves, self.spec)


def flatten(structure: Any) -> Flat:
    """Take `structure` apart into its tensors; non-tensor leaves are kept as they are."""
    leaves, spec = pytree.tree_flatten(structure)
    while _register_unknown_dataclasses(leaves):
        leaves, spec = pytree.tree_flatten(structure)
    positions = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    return Flat([leaves[i] for i in positions], leaves, positions, spec)


def map_tensors(fn: Callable[[torch.Tensor], torch.Tensor], structure: Any) -> Any:
    flat = flatten(structure)
    return flat.rebuild([fn(t) for t in flat.tensors])


def _register_unknown_dataclasses(leaves: list[Any]) -> bool:
    """Teach pytree the dataclass types among `leaves`; True when any was new (the caller flattens again)."""
    new = False
    for leaf in leaves:
        cls = type(leaf)
        if dataclasses.is_dataclass(leaf) and not isinstance(leaf, type) and cls not in pytree.SUPPORTED_NODES:
            _register_dataclass(cls)
            new = True
    return new


def _register_dataclass(cls: type) -> None:
    init_fields = [f.name for f in dataclasses.fields(cls) if f.init]

    def to_children(obj: Any) -> tuple[list[Any], list[str]]:
        return [getattr(obj, name) for name in init_fields], init_fields

    def from_children(children: Any, names: list[str]) -> Any:
        return cls(**dict(zip(names, children, strict=True)))

    pytree.register_pytree_node(cls, to_children, from_children)
