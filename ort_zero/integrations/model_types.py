"""Causal LM types that do not train in ONNX Runtime on this stack (transformers 5.23, torch 2.14, ORT 1.19.2),
each with what fails, as measured by `ort_zero.tools.causal_lm_sweep` (docs/model-families.md). `ORTZeroTrainer`
refuses them when it is created, in one line, instead of failing deep inside the export or ORT's graph build.

Types that train in ORT with losses other than native ZeRO-3's (beyond 1e-5 within 3 steps) are refused too: a
run that silently diverges from PyTorch is worse than one that stops.
"""

from __future__ import annotations

_LOSSES = "ORT trains it with losses other than native ZeRO-3's ({}, within 3 steps at a tiny size)"

UNSUPPORTED: dict[str, str] = {
    "phimoe": _LOSSES.format(
        "8.9e-5 at step 3: step 1's gradients match native's; a router mask 6e-5 from its threshold flips"
    ),
    "afmoe": _LOSSES.format("3.9e-3: its router starts at zero and ORT's TopK breaks the ties otherwise"),
    "cpmant": _LOSSES.format("1.5e-5 at step 2 in every process (the losses are near 16: about 8 float32 steps)"),
}


def unsupported_reason(model_type: str | None) -> str | None:
    """Why a model type does not train in ORT here, or None."""
    return UNSUPPORTED.get(model_type) if model_type else None
