"""How ort_zero exports the aten ops that torch's TorchScript exporter (with ORTModule's own symbolics) writes in a
form ONNX Runtime 1.19.2 rejects, or cannot write at all: one `Declaration` per op, with the model types measured
to need it (`ort_zero.tools.causal_lm_sweep`). ORTModule registers its symbolics with torch each time an ORTModule is
made (`CustomOpSymbolicRegistry.register_all`); the patch `ort.export_overrides` (ort_zero.patches) registers these
right after, so they win for every export that follows. Where ORT's own symbolic handles a case, an override hands
that case to it unchanged.
"""

from __future__ import annotations

from typing import Any

import torch

from ...declaration import Declaration
from ...foreign import onnxruntime as ort_internals
from . import symbolics as export_symbolics
from .einsum import einsum_symbolic
from .masked_fill import bool_masked_fill

# Each: target "aten::op"; its factory takes ORTModule's own symbolic for the op (or None) and returns the symbolic
# (g, *inputs) -> value that is registered.
OVERRIDES: tuple[Declaration, ...] = (
    Declaration(
        "override.layer_norm",
        "aten::layer_norm",
        "a LayerNorm without a weight (elementwise_affine=False, or F.layer_norm(x, shape)) exports as "
        "LayerNormalization with an empty scale, which ORT rejects (INVALID_GRAPH: input 1 is marked single), and "
        "one without bias gets a gradient named '_grad' per node (duplicate definition): a missing scale becomes "
        "constant ones of the normalized shape, a missing bias zeros",
        export_symbolics.weightless_layer_norm,
        ("olmo",),
    ),
    Declaration(
        "override.expm1",
        "aten::expm1",
        "torch's exporter has no symbolic for expm1 at any opset: exported as Exp(x) - 1",
        export_symbolics.expm1,
        ("apertus",),
    ),
    Declaration(
        "override.softplus",
        "aten::softplus",
        "ORT 1.19.2 has no gradient for Softplus (torch's export of softplus): exported as relu and log(1 + exp(-|x|))",
        export_symbolics.softplus,
        ("apertus", "doge"),
    ),
    Declaration(
        "override.rms_norm",
        "aten::rms_norm",
        "torch's exporter has no symbolic for rms_norm (torch.nn.RMSNorm, F.rms_norm) at opset 17: exported as ORT's "
        "SimplifiedLayerNormalization (its RMSNorm, which has a gradient)",
        export_symbolics.rms_norm,
        ("diffllama",),
    ),
    Declaration(
        "override.cumsum",
        "aten::cumsum",
        "torch's exporter writes the cumulative sum of a boolean tensor as CumSum on bool, which ONNX does not define "
        "(ORT: INVALID_GRAPH): the booleans are cast to int64 first, as torch sums them",
        export_symbolics.bool_cumsum,
        ("llama4", "llama4_text"),
    ),
    Declaration(
        "override.repeat_interleave",
        "aten::repeat_interleave",
        "torch's symbolic turns a negative dim into a positive one by adding the rank in place, to the value of the "
        "traced constant itself; the tracer shares one constant -1 among all the ops that pass it, so every later "
        "dim=-1 and view(..., -1, d) of the model took the rotary embedding's positive dim (wrong axes, a Reshape "
        "that fails): each repeat_interleave gets a constant dim of its own",
        export_symbolics.repeat_interleave_on_own_dim,
        ("cohere", "cohere2", "cohere2_moe", "ernie4_5", "ernie4_5_moe", "helium"),
    ),
    Declaration(
        "override.logsumexp",
        "aten::logsumexp",
        "ORT 1.19.2 builds an invalid gradient for ReduceLogSumExp without keepdims at opset 17 (an Unsqueeze with "
        "its axes as an attribute, which opset 13 made an input): exported with keepdims and a Squeeze after it",
        export_symbolics.logsumexp_keeping_dims,
        ("granite_swa", "granitemoe_swa"),
    ),
    Declaration(
        "override.permute",
        "aten::permute",
        "torch's symbolic writes permute's dims into Transpose's perm as given, negative ones too, which ONNX does not "
        "allow (ORT: Invalid attribute perm; the Mamba-2 mixers' permute(0, -2, -1, 1)): made nonnegative",
        export_symbolics.permute_nonnegative,
        ("bamba", "falcon_h1", "granitemoehybrid", "mamba2", "nemotron_h", "zamba2"),
    ),
    Declaration(
        "override.diff",
        "aten::diff",
        "torch's exporter has no symbolic for diff (transformers' packed-sequence check calls torch.diff on the "
        "position ids when a batch has no attention mask, as BLT's patcher's does): exported as Slice and Sub",
        export_symbolics.diff,
        ("blt",),
    ),
    Declaration(
        "override.linalg_vector_norm",
        "aten::linalg_vector_norm",
        "torch exports the L1 norm as ReduceL1, which ORT 1.19.2 has no gradient for (DBRX's router normalizes its "
        "top expert weights by it): exported as ReduceSum(Abs(x)); other norms keep torch's export",
        export_symbolics.l1_norm,
        ("dbrx",),
    ),
    Declaration(
        "override.unflatten",
        "aten::unflatten",
        "torch computes the split dimension in the graph (Add, Mod, Reshape) and slices the input's shape up to it: "
        "ORT's symbolic shape inference cannot tell the new shape's length and asserts on the Reshape "
        "(is_literal(shape_rank), Qwen4-Exp's gated residual): the dimension is resolved at export and the shape "
        "sliced at constant bounds",
        export_symbolics.unflatten,
        ("qwen4_exp", "qwen4_exp_text"),
    ),
    Declaration(
        "override.masked_fill",
        "aten::masked_fill",
        "ORT 1.19.2's CPU Where has no bool kernel (NOT_IMPLEMENTED), and torch writes masked_fill as a Where: TRL "
        "masks its bool `is_top1` this way: a bool tensor is filled as uint8 (ort_zero/ort/export/masked_fill.py)",
        bool_masked_fill,
        (),
    ),
    Declaration(
        "override.einsum",
        "aten::einsum",
        "ORT 1.19.2 has no gradient for Einsum, and ORTModule's symbolic writes only two-operand equations with an "
        "explicit output and no ellipsis without it (as a batched MatMul): XLNet's relative attention transposes "
        "its attention mask with a one-operand einsum. Every equation is brought to ORTModule's form (ellipsis and "
        "implicit output made explicit, operands contracted two at a time), one operand is ReduceSum and Transpose "
        "(ort_zero/ort/export/einsum.py)",
        einsum_symbolic,
        ("xlnet",),
    ),
)


def register_overrides(opset: int) -> None:
    """Register every override with torch's exporter for `opset`, over what ORTModule registered."""
    for override in OVERRIDES:
        ort_symbolic = ort_internals.ort_symbolic(override.target)
        torch.onnx.register_custom_op_symbolic(override.target, override.factory(ort_symbolic), opset)


def registering_overrides(register_all: Any) -> Any:
    """The replacement of ORTModule's `CustomOpSymbolicRegistry.register_all` (a classmethod): ORT's symbolics,
    then ort_zero's overrides."""

    def register_all_then_overrides(cls: type, onnx_opset_version: int) -> None:
        register_all.__func__(cls, onnx_opset_version)
        register_overrides(onnx_opset_version)

    return classmethod(register_all_then_overrides)
