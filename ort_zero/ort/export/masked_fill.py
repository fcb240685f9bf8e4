"""`masked_fill` of a bool tensor, exported as ONNX Runtime 1.19.2 can run it on CPU: its Where has no bool kernel
(NOT_IMPLEMENTED when the session is built), and torch's exporter writes masked_fill as a Where of the tensor's type.
TRL masks its bool per-token outputs with `masked_fill` (`is_top1`, the SFT accuracy metric). The bool tensor is
cast to uint8, filled, and cast back: the same values."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ...foreign import torch as torch_internals


def bool_masked_fill(ort_symbolic: Callable[..., Any] | None) -> Callable[..., Any]:
    """The export symbolic of `aten::masked_fill`: torch's (or ORTModule's), a bool input filled as uint8."""

    def masked_fill(g: Any, input: Any, mask: Any, value: Any) -> Any:
        from torch.onnx.symbolic_opset9 import masked_fill as torch_masked_fill

        fill = ort_symbolic or torch_masked_fill
        if torch_internals.onnx_dtype(input) != torch.bool:
            return fill(g, input, mask, value)
        as_uint8 = g.op("Cast", input, to_i=torch.onnx.TensorProtoDataType.UINT8)
        return g.op("Cast", fill(g, as_uint8, mask, value), to_i=torch.onnx.TensorProtoDataType.BOOL)

    return masked_fill
