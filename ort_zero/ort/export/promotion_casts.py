"""The Casts torch's TorchScript exporter inserts for implicit type promotion, with bfloat16's ONNX number.

The exporter's scalar-type analysis makes the inputs of an op that mixes dtypes agree by inserting Casts. For a
promotion to bfloat16 (a bf16 tensor times an int64 one: Mamba's `hidden_states * attention_mask[:, :, None]`, the
state-space and linear-attention families' masks) torch 2.15 writes `Cast(to=15)`: 15 is torch's number for bfloat16
and ONNX's for complex128 (ONNX's bfloat16 is 16; an explicit `.to(torch.bfloat16)` gets 16). ORT then refuses the
graph (`Type 'tensor(complex128)' ... is invalid`). ONNX has no complex tensors a torch export could make, so a Cast
to complex128 the analysis inserted is always its bfloat16: it becomes `Cast(to=BFLOAT16)`.

The same mix-up types a value before the analysis runs: the per-node inference of an op mixing a bool and a bf16
tensor (RecurrentGemma's `reset + ~reset * multiplier`) types its output ComplexDouble, and the next op that reads it
fails (`ScalarType ComplexDouble is an unexpected tensor scalar type`). Such an output is bfloat16 too; the analysis
then inserts the Casts the bool operands need.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from onnx import TensorProto

from ...foreign import torch as torch_internals

TORCH_BFLOAT16_NUMBER = TensorProto.COMPLEX128  # 15: c10::ScalarType::BFloat16 in torch


def _casts(block: Any) -> Iterator[Any]:
    for node in block.nodes():
        if node.kind() == "onnx::Cast":
            yield node
        for inner in node.blocks():
            yield from _casts(inner)


def bfloat16_promotion_casts(analysis: Callable[..., None]) -> Callable[..., None]:
    """torch's `_jit_pass_onnx_scalar_type_analysis`, its promotions to bfloat16 cast to ONNX's bfloat16."""

    @functools.wraps(analysis)
    def analysed(graph: Any, *args: Any, **kwargs: Any) -> None:
        before = set(_casts(graph))
        analysis(graph, *args, **kwargs)
        for cast in _casts(graph):
            if cast not in before and cast.i("to") == TORCH_BFLOAT16_NUMBER:
                cast.i_("to", TensorProto.BFLOAT16)

    return analysed


def bfloat16_promoted_outputs(inference: Callable[..., None]) -> Callable[..., None]:
    """torch's `_jit_pass_onnx_node_shape_type_inference`, the outputs it types complex128 typed bfloat16."""

    @functools.wraps(inference)
    def inferred(node: Any, *args: Any, **kwargs: Any) -> None:
        inference(node, *args, **kwargs)
        for output in node.outputs():
            if torch_internals.jit_value_scalar_type(output) == "ComplexDouble":
                torch_internals.set_jit_value_dtype(output, torch.bfloat16)

    return inferred
