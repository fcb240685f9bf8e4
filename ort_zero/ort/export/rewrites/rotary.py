"""Rotary embeddings computed with complex numbers (Llama 4, DeepSeek-V2): ONNX has no complex type, so while such a
model is exported its rotary module returns (cos, sin) pairs and `apply_rotary_emb` rotates pairs of channels in real
arithmetic, giving the same values."""

from __future__ import annotations

from typing import Any

import torch

from .model_rewrite import ModelRewrite, Replacement, instead


@torch.no_grad()
def rotary_pairs(self: Any, x: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    """A complex rotary embedding's forward (`Llama4TextRotaryEmbedding`, `DeepseekV2RotaryEmbedding`) without
    complex numbers: (cos, sin) of each frequency in a last dimension of 2, scaled as transformers scales its complex
    values."""
    freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
    return torch.stack((torch.cos(freqs), torch.sin(freqs)), dim=-1) * self.attention_scaling


def _rotate_pairs(
    xq: torch.Tensor, xk: torch.Tensor, freqs: torch.Tensor, head_axis: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """`apply_rotary_emb` on (cos, sin) pairs: channels (2i, 2i+1) of each head rotated as the complex product
    (a + ib)(cos + i sin) = (a cos - b sin) + i(a sin + b cos); the pairs broadcast over the heads' axis."""
    cos, sin = freqs[..., 0].unsqueeze(head_axis), freqs[..., 1].unsqueeze(head_axis)

    def rotate(x: torch.Tensor) -> torch.Tensor:
        pairs = x.float().reshape(*x.shape[:-1], -1, 2)
        real, imaginary = pairs[..., 0], pairs[..., 1]
        rotated = torch.stack((real * cos - imaginary * sin, real * sin + imaginary * cos), dim=-1)
        return rotated.flatten(3).type_as(x)

    return rotate(xq), rotate(xk)


def llama4_rotate_pairs(xq: torch.Tensor, xk: torch.Tensor, freqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Llama 4's `apply_rotary_emb` (queries and keys as batch, position, head, channel)."""
    return _rotate_pairs(xq, xk, freqs, head_axis=2)


def deepseek_v2_rotate_pairs(
    xq: torch.Tensor, xk: torch.Tensor, freqs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V2's `apply_rotary_emb` (queries and keys as batch, head, position, channel)."""
    return _rotate_pairs(xq, xk, freqs, head_axis=1)


_LLAMA4 = "transformers.models.llama4.modeling_llama4"
LLAMA4 = ModelRewrite(
    "export_llama4",
    _LLAMA4,
    ("llama4", "llama4_text"),
    "Llama 4's rotary embedding multiplies complex numbers (torch.polar, view_as_complex), which ONNX has no type "
    "for: while it is exported, the rotary module returns (cos, sin) pairs and apply_rotary_emb rotates each pair "
    "of channels in real arithmetic (the same values)",
    (
        Replacement(
            "transformers.llama4_rotary_in_export", f"{_LLAMA4}:Llama4TextRotaryEmbedding.forward",
            instead(rotary_pairs),
        ),
        Replacement(
            "transformers.llama4_apply_rotary_in_export", f"{_LLAMA4}.apply_rotary_emb",
            instead(llama4_rotate_pairs),
        ),
    ),
)  # fmt: skip
_DEEPSEEK_V2 = "transformers.models.deepseek_v2.modeling_deepseek_v2"
DEEPSEEK_V2 = ModelRewrite(
    "export_deepseek_v2",
    _DEEPSEEK_V2,
    ("deepseek_v2",),
    "DeepSeek-V2's rotary embedding multiplies complex numbers as Llama 4's does (heads before positions): the same "
    "rewrite in real arithmetic",
    (
        Replacement(
            "transformers.deepseek_v2_rotary_in_export", f"{_DEEPSEEK_V2}:DeepseekV2RotaryEmbedding.forward",
            instead(rotary_pairs),
        ),
        Replacement(
            "transformers.deepseek_v2_apply_rotary_in_export", f"{_DEEPSEEK_V2}.apply_rotary_emb",
            instead(deepseek_v2_rotate_pairs),
        ),
    ),
)  # fmt: skip
