"""Causal LM types that do not train in ONNX Runtime on this stack (transformers 5.23, torch 2.14, ORT 1.19.2),
each with what fails, as measured by `ort_zero.tools.causal_lm_sweep` (docs/model-families.md). `ORTZeroTrainer`
refuses them when it is created, in one line, instead of failing deep inside the export or ORT's graph build.

Types that train in ORT with losses other than native ZeRO-3's (beyond 1e-5 within 3 steps) are refused too: a
run that silently diverges from PyTorch is worse than one that stops.
"""

from __future__ import annotations

_SOLVE = "its linear attention solves a triangular system (linalg_solve_triangular), which has no ONNX export"
_LOSSES = "ORT trains it with losses other than native ZeRO-3's ({}, within 3 steps at a tiny size)"
_REMOVE_EDGE = "ORT's graph build fails on its exported graph (Graph::RemoveEdge: argument mismatch)"
_MAMBA2 = "ORT's symbolic shape inference fails on its Mamba-2 mixer (int(inf): the time-step clamp's upper limit)"
_TUPLES = "torch's exporter cannot lower its tuples (Couldn't lower all tuples)"

UNSUPPORTED: dict[str, str] = {
    **dict.fromkeys(("bamba", "falcon_h1", "granitemoehybrid", "mamba2", "nemotron_h", "zamba2"), _MAMBA2),
    "longcat_flash": "ORT's symbolic shape inference asserts on a Squeeze in its exported graph",
    **dict.fromkeys(("qwen3_5", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_5_text", "qwen3_next"), _SOLVE),
    **dict.fromkeys(("qwen4_exp", "qwen4_exp_text"), _SOLVE),
    "phimoe": "its router samples with Tensor.exponential_ in training, which has no ONNX export",
    "cpmant": "torch's exporter cannot trace its forward (SymbolicValueError)",
    **dict.fromkeys(("bailing_hybrid", "hy_v4", "kimi_linear", "inkling2_text"), _REMOVE_EDGE),
    "jetmoe": "its experts split the tokens by sizes computed in Python (expert_size.tolist()), which the export fixes "
    "to the routing of the batch it traces (ORT's Reshape fails once the routing changes)",
    "prophetnet": "its n-gram attention calls a Linear twice per forward; ORT's backward finds its weight not gathered",
    "blt": "its entropy patcher uses torch.diff, which has no ONNX export (aten::diff)",
    "dbrx": "ORT has no gradient for ReduceL1 (its router normalizes the top expert weights by their L1 norm)",
    "xlnet": "ORT has no gradient for Einsum (its relative attention)",
    "afmoe": _LOSSES.format("3.9e-3: its router starts at zero and ORT's TopK breaks the ties otherwise"),
    "falcon_mamba": _LOSSES.format("2.1e-3"),
    "hrm_text": _LOSSES.format("7e-5"),
    "inkling_text": _LOSSES.format("6.2e-5"),
    "lfm2_moe": _LOSSES.format("8.8e-4; a plain ORTModule without ZeRO gives native's"),
    "lfm3": _LOSSES.format("4.4e-4; a plain ORTModule without ZeRO also gives other gradients"),
    "mamba": _LOSSES.format("6.2e-5"),
    "openai-gpt": _LOSSES.format("2.6e-3"),
    "recurrent_gemma": _LOSSES.format("6e-3"),
    **dict.fromkeys(("deepseek_v4", "olmo_hybrid", "reformer"), _TUPLES),
}


def unsupported_reason(model_type: str | None) -> str | None:
    """Why a model type does not train in ORT here, or None."""
    return UNSUPPORTED.get(model_type) if model_type else None
