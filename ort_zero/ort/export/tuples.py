"""A bridge whose module's outputs nobody reads, made lowerable for torch's TorchScript exporter.

The tracer records an autograd Function that returns a tuple (every ort_zero bridge does) as a PythonOp with one
tuple-typed output, unpacked by a `prim::TupleUnpack`. Where the module's outputs are never read (a rotary embedding
whose cos/sin no layer of a tiny all-linear-attention model uses, DeepSeek-V4's attention compressor at a short
sequence), the tracer's dead-code pass drops the unpack but keeps the PythonOp (it has side effects: the release of
the module's parameters). torch's tuple lowering flattens only tuples that are read, and then stops the export
with "Couldn't lower all tuples". Handing each such output an unpack of its own, whose results nobody reads, lets
the lowering flatten it into one output per tensor like any other bridge's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ...foreign import torch as torch_internals

MODEL_TYPES = ("deepseek_v4", "olmo_hybrid", "reformer")  # the causal LM types whose export needed it


def unpack_unread_tuples(graph: Any) -> int:
    """Give every tuple output of a PythonOp in `graph` that nothing reads a `prim::TupleUnpack` (results unread);
    how many it gave."""
    unread: list[tuple[Any, Any]] = []

    def visit(block: Any) -> None:
        for node in block.nodes():
            for inner in node.blocks():
                visit(inner)
            if node.kind() == "prim::PythonOp":
                unread.extend(
                    (node, output)
                    for output in node.outputs()
                    if torch_internals.jit_tuple_elements(output) is not None and not output.uses()
                )

    visit(graph.block())
    for node, output in unread:
        elements = torch_internals.jit_tuple_elements(output)
        unpack = graph.create("prim::TupleUnpack", [output], len(elements))
        unpack.insertAfter(node)
        unpack.copyMetadata(node)
        for value, element_type in zip(unpack.outputs(), elements, strict=True):
            value.setType(element_type)
    return len(unread)


def lowering_unread_tuples(lower_all_tuples: Callable[[Any], None]) -> Callable[[Any], None]:
    """torch's `_jit_pass_lower_all_tuples`, after `unpack_unread_tuples`."""

    @functools.wraps(lower_all_tuples)
    def lower(graph: Any) -> None:
        unpack_unread_tuples(graph)
        return lower_all_tuples(graph)

    return lower
