"""Gradients ORT 1.19.2 has no builder for, registered with ORT's gradient registry the way ORTModule registers its
own (`ortmodule._custom_gradient_registry`): each ORTModule registers ORT's gradients when it is built, then
ort_zero's (the patch `ort.custom_gradients` in ort_zero.patches).

ORT looks a registered gradient up by the node's domain and op type alone, so the gradient cannot read the forward
node's attributes: each one here is written for the attributes torch's exporter writes and names those it assumes
unset; the export pass `passes.custom_gradients` refuses a graph with a node that sets one.
"""

from __future__ import annotations

from typing import Any

import onnx

from ...declaration import Declaration
from ...foreign import onnxruntime as ort_internals

_QWEN3_5 = ("qwen3_5", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_5_text", "qwen3_next", "qwen4_exp", "qwen4_exp_text")

# Each: target "domain::OpType" ("onnx": ONNX's default domain); ORT has no gradient for it to replace, so its factory
# takes None and returns the gradient in ORTModule's notation: (op, inputs, outputs[, attributes]) with GO(i), I(i),
# GI(i).
GRADIENTS: tuple[Declaration, ...] = (
    Declaration(
        "gradient.CumSum",
        "onnx::CumSum",
        "ORT 1.19.2 has no gradient for CumSum (the decay's cumulative sum in the gated delta rule of Qwen3.5/"
        "Qwen3-Next's linear attention). y[j] = sum of x[i] for i <= j along the axis, so dx[i] = sum of dy[j] for "
        "j >= i: the cumulative sum of dy in reverse. torch's exporter writes CumSum without exclusive or reverse "
        "(aten::cumsum has neither)",
        lambda none: [("CumSum", ["GO(0)", "I(1)"], ["GI(0)"], {"reverse": {"value": 1, "dtype": "int"}})],
        (*_QWEN3_5, "bailing_hybrid", "inkling2_text", "kimi_linear"),
    ),
)
ASSUMED_UNSET: dict[str, tuple[str, ...]] = {"onnx::CumSum": ("exclusive", "reverse")}
"""By target: the forward node's attributes its gradient assumes absent or 0."""


def set_attributes_assumed_unset(node: onnx.NodeProto) -> list[str]:
    """The attributes `node` sets that the registered gradient for its op assumes unset (empty for other ops)."""
    for gradient in GRADIENTS:
        if (node.domain, node.op_type) == gradient.domain_and_op():
            return [a.name for a in node.attribute if a.name in ASSUMED_UNSET.get(gradient.target, ()) and a.i != 0]
    return []


def register_gradients() -> None:
    for gradient in GRADIENTS:
        ort_internals.register_gradient(*gradient.domain_and_op(), gradient.factory(None))


def registering_gradients(register_all: Any) -> Any:
    """The replacement of ORTModule's `CustomGradientRegistry.register_all` (a classmethod): ORT's gradients, then
    ort_zero's."""

    def register_all_then_ort_zeros(cls: type) -> None:
        register_all.__func__(cls)
        register_gradients()

    return classmethod(register_all_then_ort_zeros)
