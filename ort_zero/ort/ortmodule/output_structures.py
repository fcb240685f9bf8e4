"""Model outputs that ORTModule's schema code cannot take apart, passed through it (declared in `ort_zero.patches`).

ORTModule flattens a model's outputs into the graph's output tensors and rebuilds them after every ORT run, but its
walk knows only tensors, numbers, strings, sequences and mappings: a Hugging Face causal LM at its config's defaults
(`use_cache=True`) returns its keys and values in a `transformers.cache_utils.DynamicCache`, an object of plain
attributes, and ORTModule stops with "Unsupported flatten data type". Where ORT's walk fails, ort_zero's takes over:
`torch.utils._pytree` walks the structure (transformers registers its `ModelOutput` classes there), and an object
pytree does not know is taken apart into its attributes when they hold tensors, and put together again (a new object
of the same class) after every run. So the cache's tensors are graph outputs like the logits; its numbers are those
of the export (a cache's counters are Python ints that tracing fixes, in ORT's own walk too). What neither walk can
take apart is one line naming the type and the way out.
"""

from __future__ import annotations

import dataclasses
import enum
import types
from collections.abc import Callable
from typing import Any

import torch

from ...foreign.torch import pytree
from ...hooks.nested import Flat, flatten

UNSUPPORTED = "Unsupported flatten data type"  # ORT's phrase when its walk meets a type it does not know
# Leaves kept as they are in the rebuilt output: values tracing fixes anyway, and references to things, not data.
CONSTANTS = (
    str, int, float, bool, complex, bytes, type, enum.Enum, torch.dtype, torch.device, torch.nn.Module,
    types.FunctionType, types.BuiltinFunctionType,
)  # fmt: skip


class UnflattenableOutput(TypeError):
    """A model output that neither ORT's walk nor ort_zero's can take apart; the message names it and the way out."""


@dataclasses.dataclass(frozen=True)
class ObjectState:
    """An object pytree does not know, taken apart: its class and its attributes (a pytree node itself)."""

    cls: type
    attributes: dict[str, Any]

    def restore(self) -> Any:
        instance = self.cls.__new__(self.cls)
        vars(instance).update({name: _closed(value) for name, value in self.attributes.items()})
        return instance


@dataclasses.dataclass(frozen=True)
class OutputTemplate:
    """ORTModule's output schema for outputs only ort_zero's walk takes apart: the structure, the graph's output
    tensors in order taken out of it."""

    flat: Flat

    def rebuild(self, tensors: list[torch.Tensor]) -> Any:
        return _closed(self.flat.rebuild(list(tensors)))

    def __repr__(self) -> str:  # ORT logs the schema at INFO level
        return f"OutputTemplate({len(self.flat.tensors)} tensors in {self.flat.spec})"


def take_apart(outputs: Any) -> tuple[list[torch.Tensor], OutputTemplate]:
    """The tensors among `outputs` (inside objects of plain attributes too) and the template that rebuilds them."""
    flat = flatten(_opened(outputs, frozenset()))
    for leaf in flat.leaves:
        if not (leaf is None or isinstance(leaf, (torch.Tensor, *CONSTANTS)) or _is_plain_object(leaf)):
            raise UnflattenableOutput(
                f"ORTModule cannot return a {type(leaf).__module__}.{type(leaf).__qualname__} among the model's "
                "outputs (ORT's and ort_zero's walks know tensors, numbers, sequences, mappings, dataclasses, "
                "objects of plain attributes and what torch.utils._pytree knows): register it with "
                "torch.utils._pytree.register_pytree_node, or return its tensors instead"
            )
    return flat.tensors, OutputTemplate(flat)


def extracting_any_structure(extract_schema: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces ORTModule's `_io._extract_schema`: ORT's walk; where it meets a type it does not know, ort_zero's."""

    def extract_schema_of_any_structure(data: Any, device: torch.device | None) -> Any:
        try:
            return extract_schema(data, device)
        except Exception as error:
            if UNSUPPORTED not in str(error):
                raise
        try:
            return take_apart(data)
        except UnflattenableOutput as error:
            raise UnflattenableOutput(str(error)) from None  # one line: ORT's failure says the same, less clearly

    return extract_schema_of_any_structure


def rebuilding_any_structure(unflatten: Callable[..., Any]) -> Callable[..., Any]:
    """Replaces `unflatten_data_using_schema` where ORTModule rebuilds its outputs: an `OutputTemplate` rebuilds
    them itself, any other schema is ORT's."""

    def unflatten_any_structure(data: list[torch.Tensor], schema: Any) -> Any:
        if isinstance(schema, OutputTemplate):
            return schema.rebuild(data)
        return unflatten(data, schema)

    return unflatten_any_structure


def _opened(structure: Any, holders: frozenset[int]) -> Any:
    """`structure` with every object of plain attributes that holds tensors replaced by its `ObjectState`;
    `holders` are the objects being opened around it (a reference back to one stays a reference)."""
    flat = flatten(structure)
    leaves = [_opened_leaf(leaf, holders) for leaf in flat.leaves]
    return pytree.tree_unflatten(leaves, flat.spec)


def _opened_leaf(leaf: Any, holders: frozenset[int]) -> Any:
    if not _is_plain_object(leaf) or id(leaf) in holders:
        return leaf
    attributes = {name: _opened(value, holders | {id(leaf)}) for name, value in vars(leaf).items()}
    if not flatten(attributes).tensors:
        return leaf  # nothing of the graph's in it: the object itself is kept
    return ObjectState(type(leaf), attributes)


def _is_plain_object(value: Any) -> bool:
    """An object whose state is its attributes (`vars`), not one ort_zero keeps as it is."""
    return not isinstance(value, (torch.Tensor, *CONSTANTS)) and value is not None and hasattr(value, "__dict__")


def _closed(structure: Any) -> Any:
    """`structure` with every `ObjectState` in it made an object again."""
    return pytree.tree_map(
        lambda leaf: leaf.restore() if isinstance(leaf, ObjectState) else leaf,
        structure,
        is_leaf=lambda node: isinstance(node, ObjectState),
    )
