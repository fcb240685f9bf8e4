"""Attention as torch's fused kernel inside ORT's graph.

torch's exporter writes `F.scaled_dot_product_attention` as MatMul + Softmax, so ORT keeps a heads x seq x seq
probability tensor per layer for the backward (48 MiB per layer at 12 heads, seq 1024) where torch's fused kernel
keeps its output and a log-sum-exp per row. While a ZeRO-3 model is exported, `F.scaled_dot_product_attention` (what
transformers' default `sdpa` attention calls) is replaced by `ScaledDotProductAttention`, which ORT runs as a
PythonOp: its forward is torch's own call (on CPU the flash kernel, on CUDA whatever torch picks) and its backward
that kernel's backward, on what the kernel saved. The layer-wise recompute (`ORTMODULE_MEMORY_OPT_LEVEL` 1/2) runs it
again in the backward (`RECOMPUTABLE`), as it re-runs the rest of a layer. A mask that is exactly causal runs as
`is_causal`, as natively (`is_causal_mask`). `eager` attention never calls it.

While a ZeRO-3 model is traced for its export, its partitioned weights are stand-ins of zeros (`ort.export.context`),
and so are the values attention reads (a projection of zeros): its output is then zeros (save a row that sees no
key), and the trace records the PythonOp, not what it computed; so the trace's attention is not run where the
values are zeros (162M at seq 1024: 0.4 s of a 3.1-s trace).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from ....hooks.export_mode import is_exporting
from ..kept_graph import backward_through_graph, forward_keeping_graph
from .bits import same_bits
from .context import wanted_grads
from .failures import kernel_failure


class ScaledDotProductAttention(torch.autograd.Function):
    """`F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)` run by
    torch; the mask (None, bool or additive) is read as it is, never differentiated."""

    @staticmethod
    def forward(
        ctx: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None,
        dropout_p: float,
        is_causal: bool,
        scale: float | None,
        enable_gqa: bool,
    ) -> torch.Tensor:
        wanted_grads(ctx, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        if is_exporting() and not value.any():  # values of zeros: the stand-ins' (`ort.export.context`)
            return query.new_zeros((*query.shape[:-1], value.shape[-1]))
        if attn_mask is not None and attn_mask.dtype == torch.uint8:
            attn_mask = attn_mask.bool()  # ORT hands a bool tensor over DLPack as uint8, which sdpa refuses
        if attn_mask is not None and not is_causal and is_causal_mask(attn_mask, query.shape[-2], key.shape[-2]):
            attn_mask, is_causal = None, True
        tensors = (query, key, value) if attn_mask is None else (query, key, value, attn_mask)
        attend = functools.partial(
            _torch_attention, dropout_p=dropout_p, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa
        )
        return forward_keeping_graph(ctx, attend, tensors, differentiable=(True, True, True, False)[: len(tensors)])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grads = backward_through_graph(ctx, grad, non_tensors=4)
        return grads if len(grads) == 8 else (*grads[:3], None, *grads[3:])

    @staticmethod
    def infer_shape(node: Any, shapes: list, dtypes: list) -> tuple[list, list]:
        """The query's shape with the value's head size."""
        query, value = shapes[0], shapes[2]
        if query is None or value is None:
            return [None], [dtypes[0]]
        return [list(query[:-1]) + [value[-1]]], [dtypes[0]]


def is_causal_mask(mask: torch.Tensor, queries: int, keys: int) -> bool:
    """Whether a bool mask lets each query see exactly the keys up to its own position, as sdpa's `is_causal` does.

    While ORTModule traces a model transformers cannot look at the padding, so it builds this mask where natively it
    passes `is_causal=True` and no mask; torch's kernel computes every block of a mask but skips the upper half under
    `is_causal`: half the attention's time (1.9 s of a 21 s step at seq 2048, 162M) and no copy of the mask kept."""
    if mask.dtype != torch.bool or mask.shape[-2:] != (queries, keys):
        return False
    causal = _causal(queries, keys, mask.device)
    if not mask.is_contiguous():
        return same_bits(mask, causal.expand(mask.shape))
    return all(same_bits(matrix, causal) for matrix in mask.view(-1, queries, keys))


@functools.lru_cache(maxsize=1)
def _causal(queries: int, keys: int, device: torch.device) -> torch.Tensor:
    """sdpa's causal mask for one shape (every layer of a step asks for the same: building it costs more than the
    comparison)."""
    return torch.ones(queries, keys, dtype=torch.bool, device=device).tril()


def _torch_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None, **options: Any
) -> torch.Tensor:
    """torch's kernel; a call it refuses is an error that says what to pick instead."""
    try:
        return torch.ops.aten.scaled_dot_product_attention(query, key, value, attn_mask, **options)
    except RuntimeError as error:
        mask = "no mask" if attn_mask is None else f"a {attn_mask.dtype} mask of shape {tuple(attn_mask.shape)}"
        refused = f"query {tuple(query.shape)} {query.dtype} with {mask} (is_causal={options['is_causal']})"
        raise kernel_failure(
            "scaled_dot_product_attention", refused, error,
            "load the model with attn_implementation='eager' (attention as ONNX ops)",
        ) from error  # fmt: skip


_DROPOUT_ARGUMENT = 4  # dropout_p's position among ScaledDotProductAttention.forward's arguments (ctx not counted)


def draws_dropout(node: Any) -> bool:
    """Whether a PythonOp of `ScaledDotProductAttention` (an ONNX node) draws a dropout mask: a copy would draw
    another one."""
    attributes = {attribute.name: attribute for attribute in node.attribute}
    if "input_float_scalar_positions" not in attributes:
        return False
    positions = list(attributes["input_float_scalar_positions"].ints)
    values = list(attributes["input_float_scalars"].floats)
    return _DROPOUT_ARGUMENT in positions and values[positions.index(_DROPOUT_ARGUMENT)] > 0


def sdpa_in_torch(replaced: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """The patch's factory: `F.scaled_dot_product_attention` as `ScaledDotProductAttention` while a model is exported;
    calls with arguments it does not take (a nested tensor, a non-float scale) go to torch's function."""

    def scaled_dot_product_attention(
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        if query.is_nested or not (scale is None or isinstance(scale, float)):
            return replaced(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
        return ScaledDotProductAttention.apply(
            query, key, value, attn_mask, float(dropout_p), bool(is_causal), scale, bool(enable_gqa)
        )

    return scaled_dot_product_attention
