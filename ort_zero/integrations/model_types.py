"""Causal LM types that do not train in ONNX Runtime on this stack (transformers 5.23, torch 2.14, ORT 1.19.2),
each with what fails, as measured by `ort_zero.tools.causal_lm_sweep` (docs/model-families.md). `ORTZeroTrainer`
refuses them when it is created, in one line, instead of failing deep inside the export or ORT's graph build.

Types that train in ORT with losses other than native ZeRO-3's (beyond 1e-5 within 3 steps) are refused too: a
run that silently diverges from PyTorch is worse than one that stops.
"""

from __future__ import annotations

_LOSSES = "ORT trains it with losses other than native ZeRO-3's ({}, within 3 steps at a tiny size)"
_TUPLES = "torch's exporter cannot lower its tuples (Couldn't lower all tuples)"

UNSUPPORTED: dict[str, str] = {
    "longcat_flash": "ORT's symbolic shape inference asserts on a Squeeze in its exported graph",
    "phimoe": "ORT's symbolic shape inference fails on its exported graph (int(inf) in a Cast); its router's sampling "
    "runs in PyTorch",
    "cpmant": "torch's exporter cannot trace its forward (SymbolicValueError)",
    "jetmoe": "its experts split the tokens by sizes computed in Python (expert_size.tolist()), which the export fixes "
    "to the routing of the batch it traces (ORT's Reshape fails once the routing changes)",
    "blt": "torch's exporter cannot write its scatter_reduce with include_self=False (the patch embeddings)",
    "dbrx": "its experts loop in Python over the experts the batch routes to, which the export fixes to the traced "
    "batch's routing (ORT's Split fails once it changes)",
    "xlnet": "ORT has no gradient for Einsum (its relative attention)",
    "afmoe": _LOSSES.format("3.9e-3: its router starts at zero and ORT's TopK breaks the ties otherwise"),
    "lfm3": _LOSSES.format("4.4e-4; a plain ORTModule without ZeRO also gives other gradients"),
    "openai-gpt": "its losses are NaN at a tiny size, natively too (not investigated)",
    **dict.fromkeys(("deepseek_v4", "olmo_hybrid", "reformer"), _TUPLES),
}


def unsupported_reason(model_type: str | None) -> str | None:
    """Why a model type does not train in ORT here, or None."""
    return UNSUPPORTED.get(model_type) if model_type else None
