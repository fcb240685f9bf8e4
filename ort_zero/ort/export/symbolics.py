"""The ONNX symbolics of ort_zero's export overrides (`export_overrides`: which op, why, and the model types that need
each): each factory takes ORTModule's own symbolic for the op (or None) and returns the one torch's exporter calls."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ...foreign import torch as torch_internals


def weightless_layer_norm(ort_symbolic: Callable[..., Any] | None) -> Callable[..., Any]:
    def layer_norm(g: Any, input: Any, normalized_shape: Any, weight: Any, bias: Any, eps: Any, cudnn: Any) -> Any:
        dims = torch_internals.onnx_constant_ints(normalized_shape, "normalized_shape")
        dtype = torch_internals.onnx_dtype(input)
        if torch_internals.onnx_is_none(weight):
            weight = g.op("Constant", value_t=torch.ones(dims, dtype=dtype))
        if torch_internals.onnx_is_none(bias):  # ORT's gradient names an empty bias's gradient "_grad" for every node
            bias = g.op("Constant", value_t=torch.zeros(dims, dtype=dtype))
        return ort_symbolic(g, input, normalized_shape, weight, bias, eps, cudnn)  # ORTModule 1.19.2 registers one

    return layer_norm


def expm1(ort_symbolic: Callable[..., Any] | None) -> Callable[..., Any]:
    def expm1(g: Any, input: Any) -> Any:
        one = g.op("Constant", value_t=torch.ones((), dtype=torch_internals.onnx_dtype(input)))
        return g.op("Sub", g.op("Exp", input), one)

    return expm1


def softplus(ort_symbolic: Callable[..., Any] | None) -> Callable[..., Any]:
    def softplus(g: Any, input: Any, beta: Any, threshold: Any) -> Any:
        # (1/b)·log(1 + exp(bx)) = (1/b)·(relu(bx) + log(1 + exp(-|bx|))), |y| = relu(y) + relu(-y): no overflow,
        # and every op has a gradient in ORT. Above the threshold torch returns x itself; this differs by at most
        # exp(-threshold)/b (2e-9 at torch's default of 20).
        dtype = torch_internals.onnx_dtype(input)
        scale = torch_internals.onnx_constant_float(beta, "beta")
        scaled = (
            input if scale == 1.0 else g.op("Mul", input, g.op("Constant", value_t=torch.tensor(scale, dtype=dtype)))
        )
        positive, negative = g.op("Relu", scaled), g.op("Relu", g.op("Neg", scaled))
        one = g.op("Constant", value_t=torch.ones((), dtype=dtype))
        tail = g.op("Log", g.op("Add", one, g.op("Exp", g.op("Neg", g.op("Add", positive, negative)))))
        result = g.op("Add", positive, tail)
        return (
            result if scale == 1.0 else g.op("Div", result, g.op("Constant", value_t=torch.tensor(scale, dtype=dtype)))
        )

    return softplus


def rms_norm(ort_symbolic: Callable[..., Any] | None) -> Callable[..., Any]:
    def rms_norm(g: Any, input: Any, normalized_shape: Any, weight: Any, eps: Any) -> Any:
        # ORT's own RMSNorm kernel (SimplifiedLayerNormalization, with a gradient), as ORT's fusions write it
        dims = torch_internals.onnx_constant_ints(normalized_shape, "normalized_shape")
        dtype = torch_internals.onnx_dtype(input)
        if torch_internals.onnx_is_none(weight):
            weight = g.op("Constant", value_t=torch.ones(dims, dtype=dtype))
        epsilon = (
            torch.finfo(dtype).eps
            if torch_internals.onnx_is_none(eps)
            else torch_internals.onnx_constant_float(eps, "eps")
        )
        normalized, _ = g.op(
            "SimplifiedLayerNormalization", input, weight, axis_i=-len(dims), epsilon_f=epsilon, outputs=2
        )
        return normalized

    return rms_norm


def bool_cumsum(ort_symbolic: Callable[..., Any] | None) -> Callable[..., Any]:
    def cumsum(g: Any, input: Any, dim: Any, dtype: Any = None) -> Any:
        from torch.onnx.symbolic_opset11 import cumsum as torch_cumsum

        if torch_internals.onnx_dtype(input) == torch.bool:  # torch sums booleans as int64; ONNX CumSum has no bool
            input = g.op("Cast", input, to_i=torch.onnx.TensorProtoDataType.INT64)
        return torch_cumsum(g, input, dim, dtype)

    return cumsum


def repeat_interleave_on_own_dim(ort_symbolic: Callable[..., Any] | None) -> Callable[..., Any]:
    def repeat_interleave(g: Any, input: Any, repeats: Any, dim: Any = None, output_size: Any = None) -> Any:
        from torch.onnx.symbolic_opset13 import repeat_interleave as torch_repeat_interleave

        if not torch_internals.onnx_is_none(dim):  # a constant of its own, which torch's symbolic may change
            dim = g.op("Constant", value_t=torch.tensor(torch_internals.onnx_constant_int(dim, "dim")))
        return torch_repeat_interleave(g, input, repeats, dim, output_size)

    return repeat_interleave


def logsumexp_keeping_dims(ort_symbolic: Callable[..., Any] | None) -> Callable[..., Any]:
    def logsumexp(g: Any, input: Any, dim: Any, keepdim: Any) -> Any:
        dims = torch_internals.onnx_constant_ints(dim, "dim")
        reduced = g.op("ReduceLogSumExp", input, axes_i=dims, keepdims_i=1)  # ORT's gradient is valid for this form
        if torch_internals.onnx_constant_int(keepdim, "keepdim"):
            return reduced
        if not dims:  # all dimensions reduced: every one is 1 now
            return g.op("Squeeze", reduced)
        return g.op("Squeeze", reduced, g.op("Constant", value_t=torch.tensor(dims, dtype=torch.int64)))

    return logsumexp


def permute_nonnegative(ort_symbolic: Callable[..., Any] | None) -> Callable[..., Any]:
    def permute(g: Any, input: Any, dims: Any) -> Any:
        perm = [dim % len(order) for order in [torch_internals.onnx_constant_ints(dims, "dims")] for dim in order]
        if perm == list(range(len(perm))):
            return input
        return g.op("Transpose", input, perm_i=perm)

    return permute


def diff(ort_symbolic: Callable[..., Any] | None) -> Callable[..., Any]:
    def diff(g: Any, input: Any, n: Any, dim: Any, prepend: Any, append: Any) -> Any:
        # out[i] = x[i + 1] - x[i] along dim, n times, on prepend ++ x ++ append (booleans: x[i + 1] xor x[i])
        axis = torch_internals.onnx_constant_int(dim, "dim")
        parts = [part for part in (prepend, input, append) if not torch_internals.onnx_is_none(part)]
        values = g.op("Concat", *parts, axis_i=axis) if len(parts) > 1 else input
        step = "Xor" if torch_internals.onnx_dtype(input) == torch.bool else "Sub"

        def ints(*values: int) -> Any:
            return g.op("Constant", value_t=torch.tensor(values, dtype=torch.int64))

        for _ in range(torch_internals.onnx_constant_int(n, "n")):
            later = g.op("Slice", values, ints(1), ints(torch.iinfo(torch.int64).max), ints(axis))
            earlier = g.op("Slice", values, ints(0), ints(-1), ints(axis))
            values = g.op(step, later, earlier)
        return values

    return diff


def l1_norm(ort_symbolic: Callable[..., Any] | None) -> Callable[..., Any]:
    def linalg_vector_norm(g: Any, input: Any, ord: Any, dim: Any, keepdim: Any, dtype: Any) -> Any:
        from torch.onnx.symbolic_opset11 import linalg_vector_norm as torch_norm

        if torch_internals.onnx_constant_float(ord, "ord") != 1.0 or not torch_internals.onnx_is_none(dtype):
            return torch_norm(g, input, ord, dim, keepdim, dtype)
        magnitudes = g.op("Abs", input)
        keep = int(torch_internals.onnx_constant_int(keepdim, "keepdim"))
        if torch_internals.onnx_is_none(dim):  # torch sums every element (keepdim applies to no dimension)
            return g.op("ReduceSum", magnitudes, keepdims_i=0)
        axes = torch.tensor(torch_internals.onnx_constant_ints(dim, "dim"), dtype=torch.int64)
        return g.op("ReduceSum", magnitudes, g.op("Constant", value_t=axes), keepdims_i=keep)

    return linalg_vector_norm


def unflatten(ort_symbolic: Callable[..., Any] | None) -> Callable[..., Any]:
    def unflatten(g: Any, input: Any, dim: Any, unflattened_size: Any) -> Any:
        from torch.onnx.symbolic_opset13 import unflatten as torch_unflatten

        rank = torch_internals.onnx_rank(input)
        try:
            axis, sizes = (
                torch_internals.onnx_constant_int(dim, "dim"),
                torch_internals.onnx_constant_ints(unflattened_size, "unflattened_size"),
            )
        except RuntimeError:  # sizes computed in the graph: torch's export
            return torch_unflatten(g, input, dim, unflattened_size)
        if rank is None:
            return torch_unflatten(g, input, dim, unflattened_size)
        axis %= rank

        def ints(*values: int) -> Any:
            return g.op("Constant", value_t=torch.tensor(values, dtype=torch.int64))

        # the new shape: the dimensions before `axis`, the sizes, those after, each slice of Shape at literal bounds
        shape = g.op("Shape", input)
        parts = [g.op("Slice", shape, ints(0), ints(axis))] if axis else []
        parts.append(ints(*sizes))
        if axis < rank - 1:
            parts.append(g.op("Slice", shape, ints(axis + 1), ints(rank)))
        return g.op("Reshape", input, g.op("Concat", *parts, axis_i=0) if len(parts) > 1 else parts[0])

    return unflatten
