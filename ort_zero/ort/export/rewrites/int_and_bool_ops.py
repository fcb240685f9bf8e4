"""Bools and int64s that torch's exporter or ORT 1.19.2 treat otherwise than PyTorch: a Python bool scattered into a
tensor (the exporter's alias analysis asserts; not a model rewrite: `ort_zero.patches` applies it in the group
"ort_export", for every ZeRO-3 export), CPM-Ant's int64 mask or-ed with bools (no opset ORT trains exports it) and
BLT's hash powers, an int64 Pow that wraps in torch and that ORT computes in floating point."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from .model_rewrite import ModelRewrite, Replacement, instead


def scatter_bool_value_as_int(scatter: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """`Tensor.scatter`/`scatter_` with a Python bool as its value, traced with the same value as an int (0 or 1).

    torch's tracer records a bool where the op takes a Scalar, and the TorchScript exporter's alias analysis then
    finds no schema for it (an internal assert): the sparse attention of DeepSeek-V3.2-like types builds its mask
    with `.scatter(-1, topk, False)`. Scattered into a bool tensor, 0 and 1 are False and True."""

    @functools.wraps(scatter)
    def scatter_with_int(self: torch.Tensor, dim: int, index: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if args and isinstance(args[0], bool):
            args = (int(args[0]), *args[1:])
        if isinstance(kwargs.get("value"), bool):
            kwargs["value"] = int(kwargs["value"])
        return scatter(self, dim, index, *args, **kwargs)

    return scatter_with_int


def mask_from_bool_context(prepare: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """CPM-Ant's `_prepare_attention_mask(input_ids, span, context, length)` with `context != 0` for `context`: the
    int mask's or/and with bool masks become ops on bools, true where the int mask is nonzero."""

    @functools.wraps(prepare)
    def prepare_from_bools(
        self: Any, input_ids: torch.Tensor, span: torch.Tensor, context: torch.Tensor, length: torch.Tensor
    ) -> torch.Tensor:
        return prepare(self, input_ids, span, context != 0, length)

    return prepare_from_bools


def rolling_polynomial_hash_with_constant_powers(token_tensor: torch.Tensor, prime: int = 1000000007) -> torch.Tensor:
    """transformers' BLT `rolling_polynomial_hash`: sum of token_i * prime**i over the last dimension, in int64 as
    torch computes it (every product wraps modulo 2**64), with the powers computed here instead of by a Pow in the
    graph. The group size (the last dimension) is a constant of the export (BLT's unfold window)."""
    powers, power = [], 1
    for _ in range(int(token_tensor.shape[-1])):
        powers.append(power - 2**64 if power >= 2**63 else power)
        power = power * prime % 2**64
    weights = torch.tensor(powers, dtype=torch.int64, device=token_tensor.device)
    return torch.sum(token_tensor * weights, dim=-1)


_CPMANT = "transformers.models.cpmant.modeling_cpmant"
CPMANT = ModelRewrite(
    "export_cpmant",
    _CPMANT,
    ("cpmant",),
    "CPM-Ant builds its attention mask from `context`, an int64 tensor of ones, or-ed with bool masks (`int | bool`): "
    "torch exports a bitwise or of ints at no opset ORT 1.19.2 trains (ONNX's Or takes bools; the exporter refuses, "
    "SymbolicValueError): while it is exported the mask is built from `context != 0`, whose masks are true where "
    "the int ones are nonzero, which is all the attention reads of them (`mask == False`)",
    (
        Replacement(
            "transformers.cpmant_bool_mask_in_export", f"{_CPMANT}:CpmAntModel._prepare_attention_mask",
            mask_from_bool_context,
        ),
    ),
)  # fmt: skip
_BLT = "transformers.models.blt.modeling_blt"
BLT = ModelRewrite(
    "export_blt",
    _BLT,
    ("blt",),
    "BLT's hash embeddings hash byte groups with powers of large primes, `prime ** arange(group)` on int64, which "
    "wraps around as it overflows; torch exports it as Pow, and ORT 1.19.2's int64 Pow computes in floating point "
    "(1000000007**2 is 1000000014000000000, not ...049; an overflow saturates where torch wraps): every hash id "
    "differed, so every hash embedding row read was another. While it is exported the powers are computed at "
    "export time, wrapped as torch wraps them, and the graph gets them as a constant",
    (
        Replacement(
            "transformers.blt_hash_in_export", f"{_BLT}.rolling_polynomial_hash",
            instead(rolling_polynomial_hash_with_constant_powers),
        ),
    ),
)  # fmt: skip
