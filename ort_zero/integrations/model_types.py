"""Causal LM types that do not train in ONNX Runtime on this stack (transformers 5.23, torch 2.14, ORT 1.19.2),
each with what fails, as measured by `ort_zero.tools.causal_lm_sweep` (docs/model-families.md). `ORTZeroTrainer`
refuses them when it is created, in one line, instead of failing deep inside the export or ORT's graph build.

Types whose failure ort_zero already reports in one line with a way out (a parameter read outside its module) and
types that train with other losses are not listed.
"""

from __future__ import annotations

_SHAPES = "ORT's symbolic shape inference fails on the exported graph and ORT's Reshape then fails at run time"
_ALIAS = "torch's TorchScript exporter fails an internal assert on the attention's in-place scatter with a reduction"
_SOLVE = "its linear attention solves a triangular system (linalg_solve_triangular), which has no ONNX export"

UNSUPPORTED: dict[str, str] = {
    **dict.fromkeys(("cohere", "cohere2", "cohere2_moe", "ernie4_5", "ernie4_5_moe", "falcon_h1", "helium"), _SHAPES),
    "nemotron_h": _SHAPES,
    **dict.fromkeys(("axk2", "deepseek_v32", "glm_moe_dsa", "hy_v4"), _ALIAS),
    **dict.fromkeys(("qwen3_5", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_5_text", "qwen3_next"), _SOLVE),
    **dict.fromkeys(("qwen4_exp", "qwen4_exp_text"), _SOLVE),
    **dict.fromkeys(("glm", "glm4"), "torch's exporter stops on tensors of different rank in one concatenation"),
    **dict.fromkeys(("granite_swa", "granitemoe_swa"), "ORT builds an invalid gradient for its ReduceLogSumExp"),
    "deepseek_v2": "its rotary embedding computes with complex numbers (torch.polar), which ONNX has no type for",
    "phimoe": "its router samples with Tensor.exponential_ in training, which has no ONNX export",
    "cpmant": "torch's exporter cannot trace its forward (SymbolicValueError)",
    **dict.fromkeys(
        ("deepseek_v4", "olmo_hybrid"), "torch's exporter cannot lower its tuples (Couldn't lower all tuples)"
    ),
}


def unsupported_reason(model_type: str | None) -> str | None:
    """Why a model type does not train in ORT here, or None."""
    return UNSUPPORTED.get(model_type) if model_type else None
