"""The autograd Functions ORT's graph runs at every step that ort_zero's passes insert, besides ZeRO-3's bridges
(`ort_zero.zero3`): where a graph's parameters come from, and 16-bit gradient sums. Where their nodes go is the
passes' (`passes.zero3_params`, `passes.mem_efficient_grads`, `passes.gradient_sums`); what they run is here.

    ParamPull       the one-element placeholders that stand for partitioned parameters at the bridges' inputs
    ParamRetrieval  one ordinary parameter handed to ORT; its gradient given to PyTorch as soon as ORT has it
    SumOfGradients  a 16-bit value's gradients added by torch (on the CPU, where ORT has no 16-bit Sum)
"""

from __future__ import annotations

from typing import Any

import onnx
import torch

from ...python_op import KeyedRegistry, ints_attribute, onnx_dtype, records_errors

RETRIEVED_PARAMS: KeyedRegistry[torch.nn.Parameter] = KeyedRegistry("parameter handed to ORT")
"""The parameters `ParamRetrieval` nodes hand to ORT, by the key their node carries (`id(param)`)."""


@records_errors
class ParamPull(torch.autograd.Function):
    """Source of the placeholders that stand for partitioned parameters in the rewritten graph."""

    @staticmethod
    def forward(ctx: Any, count: int, trigger: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.trigger_like = (trigger.shape, trigger.dtype, trigger.device)
        return tuple(torch.zeros(1, dtype=trigger.dtype, device=trigger.device) for _ in range(count))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[Any, ...]:
        shape, dtype, device = ctx.trigger_like
        return None, torch.zeros(shape, dtype=dtype, device=device)

    @staticmethod
    def infer_shape(node: Any, shapes: list, dtypes: list) -> tuple[list, list]:
        count = len(node.output) - 1
        return [[1]] * count, [onnx.TensorProto.FLOAT] * count


@records_errors
class ParamRetrieval(torch.autograd.Function):
    """Hands one parameter to ORT in forward; gives its gradient to PyTorch in backward (`param.backward(grad)`:
    AccumulateGrad and every hook on the parameter fire during ORT's backward)."""

    @staticmethod
    def forward(ctx: Any, key: int, trigger: torch.Tensor) -> torch.Tensor:
        ctx.key = key
        ctx.trigger_like = (trigger.shape, trigger.dtype, trigger.device)
        return RETRIEVED_PARAMS[key].detach()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor | None) -> tuple[Any, ...]:
        if grad is not None:
            RETRIEVED_PARAMS[ctx.key].backward(grad)
        shape, dtype, device = ctx.trigger_like
        return None, torch.zeros(shape, dtype=dtype, device=device)

    @staticmethod
    def infer_shape(node: Any, shapes: list, dtypes: list) -> tuple[list, list]:
        keys = ints_attribute(node, "input_int_scalars")
        if not keys:
            raise RuntimeError(f"ort_zero: PythonOp {node.name} carries no parameter key")
        param = RETRIEVED_PARAMS[keys[0]]
        return [list(param.shape)], [onnx_dtype(param.dtype)]


@records_errors
class SumOfGradients(torch.autograd.Function):
    """The sum of one value's gradients, run by ORT without autograd (its forward is the whole job); `count`, how
    many, is the integer input a PythonOp node carries."""

    @staticmethod
    def forward(ctx: Any, count: int, *grads: torch.Tensor) -> torch.Tensor:
        shaped = any(grad.dim() > 0 for grad in grads)
        # a 0-dim gradient beside shaped ones is the scalar zero of scalar_output_grads: it adds nothing
        terms = [grad for grad in grads if grad.dim() > 0 or not shaped or bool(grad != 0)]
        total = torch.add(terms[0], terms[1]) if len(terms) > 1 else terms[0].clone()  # never an input: ORT owns it
        for term in terms[2:]:
            total.add_(term)
        return total
