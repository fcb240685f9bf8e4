"""Model code that ONNX cannot express, replaced by an equivalent while ORTModule exports a model that runs it.

An op-level override (`export_overrides`) cannot help where a model computes in a dtype ONNX lacks: Llama 4 turns its
rotary embedding into complex numbers (`torch.polar`, `view_as_complex`), and ONNX has no complex tensors. For such
a model the functions themselves are replaced during the export by ones that compute the same values in real
arithmetic; PyTorch runs of the same model keep transformers' own. The same mechanism replaces MoE layers that route
tokens in Python (DBRX, JetMoE, LongCat-Flash), whose routing a trace would keep as constants, by batched ones. Each
rewrite is a patch group in `ort_zero.patches` (with the transformers versions it was written for), applied only
while a ZeRO-3 model whose modules come from that modeling file is exported.

One module per kind of rewrite, each declaring its `ModelRewrite`s (`model_rewrite`) with the symbols they replace:
`rotary` (complex rotary embeddings), `moe` (experts routed in Python), `autograd_functions` (no_grad blocks) and
`int_and_bool_ops` (bools and int64s ORT or the exporter treat otherwise).
"""

from __future__ import annotations

import torch

from .autograd_functions import HRM_TEXT
from .int_and_bool_ops import BLT, CPMANT
from .model_rewrite import ModelRewrite, Replacement
from .moe import DBRX, JETMOE, LONGCAT_FLASH
from .rotary import DEEPSEEK_V2, LLAMA4

__all__ = [
    "BLT", "CPMANT", "DBRX", "DEEPSEEK_V2", "HRM_TEXT", "JETMOE", "LLAMA4", "LONGCAT_FLASH",
    "REWRITES", "ModelRewrite", "Replacement", "groups_for",
]  # fmt: skip

REWRITES = (
    LLAMA4, DEEPSEEK_V2, CPMANT, DBRX, JETMOE, LONGCAT_FLASH, BLT, HRM_TEXT,
)  # fmt: skip


def groups_for(module: torch.nn.Module) -> list[str]:
    """The rewrite groups a model being exported needs: those whose modeling file one of its modules comes from."""
    modules = {type(submodule).__module__ for submodule in module.modules()}
    return [rewrite.group for rewrite in REWRITES if rewrite.modeling_module in modules]
