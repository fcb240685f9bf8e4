"""Causal LM types that do not train in ONNX Runtime on this stack (transformers 5.23, torch 2.14, ORT 1.19.2),
each with what fails, as measured by `ort_zero.tools.causal_lm_sweep` (docs/model-families.md). `ORTZeroTrainer`
refuses them when it is created, in one line, instead of failing deep inside the export or ORT's graph build.

Types that train in ORT with losses other than native ZeRO-3's (beyond 1e-5 within 3 steps) are refused too: a
run that silently diverges from PyTorch is worse than one that stops.
"""

from __future__ import annotations

_QWEN4 = (
    "ORT crashes in the backward (a segmentation fault, no message; past ORT's symbolic shape inference since "
    "ort_zero exports unflatten its own way); one run without the native run first trained with native's losses"
)
_LOSSES = "ORT trains it with losses other than native ZeRO-3's ({}, within 3 steps at a tiny size)"

UNSUPPORTED: dict[str, str] = {
    "mamba2": _LOSSES.format("2e-5"),
    **dict.fromkeys(("qwen4_exp", "qwen4_exp_text"), _QWEN4),
    **dict.fromkeys(
        ("qwen3_5_moe", "qwen3_5_moe_text"),
        "ORT crashes in the backward in some processes (a segmentation fault; it depends on PYTHONHASHSEED) and "
        "trains with losses from native's to 1.4e-5 off them in others",
    ),
    "phimoe": _LOSSES.format(
        "8.9e-5 at step 3: step 1's gradients match native's; a router mask 6e-5 from its threshold flips"
    ),
    "inkling2_text": _LOSSES.format("4e-5 in one process of three"),
    "afmoe": _LOSSES.format("3.9e-3: its router starts at zero and ORT's TopK breaks the ties otherwise"),
    "bailing_hybrid": _LOSSES.format("8e-5"),
    "kimi_linear": _LOSSES.format("1.3e-4"),
    "falcon_mamba": _LOSSES.format("2.1e-3"),
    "hrm_text": _LOSSES.format("7e-5"),
    "inkling_text": _LOSSES.format("6.2e-5"),
    "mamba": _LOSSES.format("6.2e-5"),
    "recurrent_gemma": _LOSSES.format("6e-3"),
}


def unsupported_reason(model_type: str | None) -> str | None:
    """Why a model type does not train in ORT here, or None."""
    return UNSUPPORTED.get(model_type) if model_type else None
