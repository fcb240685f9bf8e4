"""How ort_zero exports the aten ops that torch's TorchScript exporter (with ORTModule's own symbolics) writes in a
form ONNX Runtime 1.19.2 rejects, or cannot write at all: one `ExportOverride` per op, with the model types measured
to need it (`ort_zero.tools.causal_lm_sweep`). ORTModule registers its symbolics with torch each time an ORTModule is
made (`CustomOpSymbolicRegistry.register_all`); the patch `ort.export_overrides` (ort_zero.patches) registers these
right after, so they win for every export that follows. Where ORT's own symbolic handles a case, an override hands
that case to it unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..foreign import ortmodule as ort_internals
from ..foreign import torch as torch_internals
from .export_einsum import einsum_symbolic
from .export_masked_fill import bool_masked_fill


@dataclass(frozen=True)
class ExportOverride:
    op: str  # "aten::name"
    needed_by: tuple[str, ...]  # transformers model types whose export fails without it
    reason: str
    # (g, *inputs) -> value; `ort_symbolic` is ORTModule's own symbolic for the op, or None
    make_symbolic: Callable[[Callable[..., Any] | None], Callable[..., Any]]


def _weightless_layer_norm(ort_symbolic: Callable[..., Any] | None) -> Callable[..., Any]:
    def layer_norm(g: Any, input: Any, normalized_shape: Any, weight: Any, bias: Any, eps: Any, cudnn: Any) -> Any:
        dims = torch_internals.onnx_constant_ints(normalized_shape, "normalized_shape")
        dtype = torch_internals.onnx_dtype(input)
        if torch_internals.onnx_is_none(weight):
            weight = g.op("Constant", value_t=torch.ones(dims, dtype=dtype))
        if torch_internals.onnx_is_none(bias):  # ORT's gradient names an empty bias's gradient "_grad" for every node
            bias = g.op("Constant", value_t=torch.zeros(dims, dtype=dtype))
        return ort_symbolic(g, input, normalized_shape, weight, bias, eps, cudnn)  # ORTModule 1.19.2 registers one

    return layer_norm


def _expm1(ort_symbolic: Callable[..., Any] | None) -> Callable[..., Any]:
    def expm1(g: Any, input: Any) -> Any:
        one = g.op("Constant", value_t=torch.ones((), dtype=torch_internals.onnx_dtype(input)))
        return g.op("Sub", g.op("Exp", input), one)

    return expm1


def _softplus(ort_symbolic: Callable[..., Any] | None) -> Callable[..., Any]:
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


def _rms_norm(ort_symbolic: Callable[..., Any] | None) -> Callable[..., Any]:
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


def _bool_cumsum(ort_symbolic: Callable[..., Any] | None) -> Callable[..., Any]:
    def cumsum(g: Any, input: Any, dim: Any, dtype: Any = None) -> Any:
        from torch.onnx.symbolic_opset11 import cumsum as torch_cumsum

        if torch_internals.onnx_dtype(input) == torch.bool:  # torch sums booleans as int64; ONNX CumSum has no bool
            input = g.op("Cast", input, to_i=torch.onnx.TensorProtoDataType.INT64)
        return torch_cumsum(g, input, dim, dtype)

    return cumsum


def _repeat_interleave_on_own_dim(ort_symbolic: Callable[..., Any] | None) -> Callable[..., Any]:
    def repeat_interleave(g: Any, input: Any, repeats: Any, dim: Any = None, output_size: Any = None) -> Any:
        from torch.onnx.symbolic_opset13 import repeat_interleave as torch_repeat_interleave

        if not torch_internals.onnx_is_none(dim):  # a constant of its own, which torch's symbolic may change
            dim = g.op("Constant", value_t=torch.tensor(torch_internals.onnx_constant_int(dim, "dim")))
        return torch_repeat_interleave(g, input, repeats, dim, output_size)

    return repeat_interleave


def _logsumexp_keeping_dims(ort_symbolic: Callable[..., Any] | None) -> Callable[..., Any]:
    def logsumexp(g: Any, input: Any, dim: Any, keepdim: Any) -> Any:
        dims = torch_internals.onnx_constant_ints(dim, "dim")
        reduced = g.op("ReduceLogSumExp", input, axes_i=dims, keepdims_i=1)  # ORT's gradient is valid for this form
        if torch_internals.onnx_constant_int(keepdim, "keepdim"):
            return reduced
        if not dims:  # all dimensions reduced: every one is 1 now
            return g.op("Squeeze", reduced)
        return g.op("Squeeze", reduced, g.op("Constant", value_t=torch.tensor(dims, dtype=torch.int64)))

    return logsumexp


def _permute_nonnegative(ort_symbolic: Callable[..., Any] | None) -> Callable[..., Any]:
    def permute(g: Any, input: Any, dims: Any) -> Any:
        perm = [dim % len(order) for order in [torch_internals.onnx_constant_ints(dims, "dims")] for dim in order]
        if perm == list(range(len(perm))):
            return input
        return g.op("Transpose", input, perm_i=perm)

    return permute


def _diff(ort_symbolic: Callable[..., Any] | None) -> Callable[..., Any]:
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


def _l1_norm(ort_symbolic: Callable[..., Any] | None) -> Callable[..., Any]:
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


def _unflatten(ort_symbolic: Callable[..., Any] | None) -> Callable[..., Any]:
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


OVERRIDES: tuple[ExportOverride, ...] = (
    ExportOverride(
        "aten::layer_norm",
        ("olmo",),
        "a LayerNorm without a weight (elementwise_affine=False, or F.layer_norm(x, shape)) exports as "
        "LayerNormalization with an empty scale, which ORT rejects (INVALID_GRAPH: input 1 is marked single), and "
        "one without bias gets a gradient named '_grad' per node (duplicate definition): a missing scale becomes "
        "constant ones of the normalized shape, a missing bias zeros",
        _weightless_layer_norm,
    ),
    ExportOverride(
        "aten::expm1",
        ("apertus",),
        "torch's exporter has no symbolic for expm1 at any opset: exported as Exp(x) - 1",
        _expm1,
    ),
    ExportOverride(
        "aten::softplus",
        ("apertus", "doge"),
        "ORT 1.19.2 has no gradient for Softplus (torch's export of softplus): exported as relu and log(1 + exp(-|x|))",
        _softplus,
    ),
    ExportOverride(
        "aten::rms_norm",
        ("diffllama",),
        "torch's exporter has no symbolic for rms_norm (torch.nn.RMSNorm, F.rms_norm) at opset 17: exported as ORT's "
        "SimplifiedLayerNormalization (its RMSNorm, which has a gradient)",
        _rms_norm,
    ),
    ExportOverride(
        "aten::cumsum",
        ("llama4", "llama4_text"),
        "torch's exporter writes the cumulative sum of a boolean tensor as CumSum on bool, which ONNX does not define "
        "(ORT: INVALID_GRAPH): the booleans are cast to int64 first, as torch sums them",
        _bool_cumsum,
    ),
    ExportOverride(
        "aten::repeat_interleave",
        ("cohere", "cohere2", "cohere2_moe", "ernie4_5", "ernie4_5_moe", "helium"),
        "torch's symbolic turns a negative dim into a positive one by adding the rank in place, to the value of the "
        "traced constant itself; the tracer shares one constant -1 among all the ops that pass it, so every later "
        "dim=-1 and view(..., -1, d) of the model took the rotary embedding's positive dim (wrong axes, a Reshape "
        "that fails): each repeat_interleave gets a constant dim of its own",
        _repeat_interleave_on_own_dim,
    ),
    ExportOverride(
        "aten::logsumexp",
        ("granite_swa", "granitemoe_swa"),
        "ORT 1.19.2 builds an invalid gradient for ReduceLogSumExp without keepdims at opset 17 (an Unsqueeze with "
        "its axes as an attribute, which opset 13 made an input): exported with keepdims and a Squeeze after it",
        _logsumexp_keeping_dims,
    ),
    ExportOverride(
        "aten::permute",
        ("bamba", "falcon_h1", "granitemoehybrid", "mamba2", "nemotron_h", "zamba2"),
        "torch's symbolic writes permute's dims into Transpose's perm as given, negative ones too, which ONNX does not "
        "allow (ORT: Invalid attribute perm; the Mamba-2 mixers' permute(0, -2, -1, 1)): made nonnegative",
        _permute_nonnegative,
    ),
    ExportOverride(
        "aten::diff",
        ("blt",),
        "torch's exporter has no symbolic for diff (transformers' packed-sequence check calls torch.diff on the "
        "position ids when a batch has no attention mask, as BLT's patcher's does): exported as Slice and Sub",
        _diff,
    ),
    ExportOverride(
        "aten::linalg_vector_norm",
        ("dbrx",),
        "torch exports the L1 norm as ReduceL1, which ORT 1.19.2 has no gradient for (DBRX's router normalizes its "
        "top expert weights by it): exported as ReduceSum(Abs(x)); other norms keep torch's export",
        _l1_norm,
    ),
    ExportOverride(
        "aten::unflatten",
        ("qwen4_exp", "qwen4_exp_text"),
        "torch computes the split dimension in the graph (Add, Mod, Reshape) and slices the input's shape up to it: "
        "ORT's symbolic shape inference cannot tell the new shape's length and asserts on the Reshape "
        "(is_literal(shape_rank), Qwen4-Exp's gated residual): the dimension is resolved at export and the shape "
        "sliced at constant bounds",
        _unflatten,
    ),
    ExportOverride(
        "aten::masked_fill",
        (),
        "ORT 1.19.2's CPU Where has no bool kernel (NOT_IMPLEMENTED), and torch writes masked_fill as a Where: TRL "
        "masks its bool `is_top1` this way: a bool tensor is filled as uint8 (ort_zero/ort/export_masked_fill.py)",
        bool_masked_fill,
    ),
    ExportOverride(
        "aten::einsum",
        ("xlnet",),
        "ORT 1.19.2 has no gradient for Einsum, and ORTModule's symbolic writes only two-operand equations with an "
        "explicit output and no ellipsis without it (as a batched MatMul): XLNet's relative attention transposes "
        "its attention mask with a one-operand einsum. Every equation is brought to ORTModule's form (ellipsis and "
        "implicit output made explicit, operands contracted two at a time), one operand is ReduceSum and Transpose "
        "(ort_zero/ort/export_einsum.py)",
        einsum_symbolic,
    ),
)


def register_overrides(opset: int) -> None:
    """Register every override with torch's exporter for `opset`, over what ORTModule registered."""
    for override in OVERRIDES:
        ort_symbolic = ort_internals.ort_symbolic(override.op)
        torch.onnx.register_custom_op_symbolic(override.op, override.make_symbolic(ort_symbolic), opset)


def registering_overrides(register_all: Any) -> Any:
    """The replacement of ORTModule's `CustomOpSymbolicRegistry.register_all` (a classmethod): ORT's symbolics,
    then ort_zero's overrides."""

    def register_all_then_overrides(cls: type, onnx_opset_version: int) -> None:
        register_all.__func__(cls, onnx_opset_version)
        register_overrides(onnx_opset_version)

    return classmethod(register_all_then_overrides)
