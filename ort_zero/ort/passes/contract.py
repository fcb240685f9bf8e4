"""What a graph pass may do to a graph's nodes, declared with the pass (`GraphPass.edits`) and checked.

The pipeline runs each pass between two snapshots of the graph's nodes where ORT_ZERO_CHECK_PASSES=1 (the tests set
it): an edit the pass does not declare stops the export with the pass's name and the nodes it touched.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import NamedTuple

import onnx


class Edit(enum.Enum):
    INSERT = "inserts nodes"
    REWIRE = "rewires nodes (the values they read or write)"
    REWRITE = "rewrites nodes (their op or attributes)"
    REMOVE = "removes nodes"


class _Node(NamedTuple):
    """What a snapshot keeps of a node: its wiring (REWIRE) and what it computes (REWRITE)."""

    domain: str
    op_type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attributes: bytes

    def wiring(self) -> tuple:
        return self.inputs, self.outputs

    def computation(self) -> tuple:
        return self.domain, self.op_type, self.attributes


def snapshot(graph: onnx.GraphProto) -> dict[str, _Node]:
    """Every node by its name (an unnamed one by its first output, unique in a graph)."""
    return {
        node.name or f"output {node.output[0] if node.output else ''}": _Node(
            node.domain,
            node.op_type,
            tuple(node.input),
            tuple(node.output),
            b"".join(attribute.SerializeToString() for attribute in node.attribute),
        )
        for node in graph.node
    }


def edits_made(before: dict[str, _Node], after: dict[str, _Node]) -> dict[Edit, list[str]]:
    """What changed between two snapshots, with the names of the nodes of each kind of edit."""
    made: dict[Edit, list[str]] = {}
    for edit, names in (
        (Edit.INSERT, after.keys() - before.keys()),
        (Edit.REMOVE, before.keys() - after.keys()),
        (Edit.REWIRE, _changed(before, after, _Node.wiring)),
        (Edit.REWRITE, _changed(before, after, _Node.computation)),
    ):
        if names:
            made[edit] = sorted(names)
    return made


def _changed(before: dict[str, _Node], after: dict[str, _Node], part: Callable[[_Node], tuple]) -> list[str]:
    return [name for name in before.keys() & after.keys() if part(before[name]) != part(after[name])]


def undeclared(pass_name: str, declared: frozenset[Edit], made: dict[Edit, list[str]]) -> str:
    """The error for the edits `made` outside `declared` ('' when there are none)."""
    outside = [f"{edit.value} ({', '.join(names[:3])}{' ...' if len(names) > 3 else ''})"
               for edit, names in made.items() if edit not in declared]  # fmt: skip
    if not outside:
        return ""
    return f"ort_zero: graph pass {pass_name} {'; '.join(outside)}, which it does not declare (its GraphPass.edits)"
