"""Model code that ONNX cannot express, replaced by an equivalent while ORTModule exports a model that runs it.

An op-level override (`export_overrides`) cannot help where a model computes in a dtype ONNX lacks: Llama 4 turns its
rotary embedding into complex numbers (`torch.polar`, `view_as_complex`), and ONNX has no complex tensors. For such
a model the functions themselves are replaced during the export by ones that compute the same values in real
arithmetic; PyTorch runs of the same model keep transformers' own. Each rewrite is a patch group in
`ort_zero.patches` (with the transformers versions it was written for), applied only while a ZeRO-3 model whose
modules come from that modeling file is exported.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class ModelRewrite:
    group: str  # the patch group in ort_zero.patches
    modeling_module: str  # the transformers module whose classes the model is built from
    model_types: tuple[str, ...]
    reason: str


LLAMA4 = ModelRewrite(
    "export_llama4",
    "transformers.models.llama4.modeling_llama4",
    ("llama4", "llama4_text"),
    "Llama 4's rotary embedding multiplies complex numbers (torch.polar, view_as_complex), which ONNX has no type "
    "for: while it is exported, the rotary module returns (cos, sin) pairs and apply_rotary_emb rotates each pair "
    "of channels in real arithmetic (the same values)",
)
DEEPSEEK_V2 = ModelRewrite(
    "export_deepseek_v2",
    "transformers.models.deepseek_v2.modeling_deepseek_v2",
    ("deepseek_v2",),
    "DeepSeek-V2's rotary embedding multiplies complex numbers as Llama 4's does (heads before positions): the same "
    "rewrite in real arithmetic",
)
_CAUSAL_CONV_REASON = (
    "transformers' causal convolution (causal_conv1d_fn's PyTorch fallback in the linear attention: a depthwise "
    "Conv1d padded by kernel - 1 on both sides, of which the first seq_len outputs are kept) exported as "
    "Conv(pads) then Slice makes ORT 1.19.2's CPU backward corrupt its memory arena in these models' graphs "
    "(BFCArena FreeAndMaybeCoalesce, or a PythonOp's context lost; not reproduced on a lone Conv and Slice): while "
    "they are exported the input is padded on the left only and convolved without padding (the same values)"
)
CAUSAL_CONVS = tuple(
    ModelRewrite(
        f"export_{name}_causal_conv", f"transformers.models.{name}.modeling_{name}", types, _CAUSAL_CONV_REASON
    )
    for name, types in (
        ("qwen3_5", ("qwen3_5", "qwen3_5_text")),
        ("qwen3_5_moe", ("qwen3_5_moe", "qwen3_5_moe_text")),
        ("qwen3_next", ("qwen3_next",)),
        ("qwen4_exp", ("qwen4_exp", "qwen4_exp_text")),
        ("kimi_linear", ("kimi_linear",)),
        ("bailing_hybrid", ("bailing_hybrid",)),
        ("inkling2", ("inkling2_text",)),
    )
)
HRM_TEXT = ModelRewrite(
    "export_hrm_text",
    "transformers.models.hrm_text.modeling_hrm_text",
    ("hrm_text",),
    "HRM runs its first low-level cycles under torch.no_grad() (only the last L_bp_cycles of each high-level cycle "
    "pass gradients back), and an ONNX graph has no grad mode: ORT differentiated every cycle (other gradients, "
    "losses 7e-5 off native's within 3 steps). While it is exported, a stack called inside a no_grad the model "
    "entered returns its output through a Function whose gradient is zero (the cycles before it get none, as in "
    "PyTorch; ORT still runs their backward, on zeros)",
)
REWRITES = (LLAMA4, DEEPSEEK_V2, *CAUSAL_CONVS, HRM_TEXT)


def groups_for(module: torch.nn.Module) -> list[str]:
    """The rewrite groups a model being exported needs: those whose modeling file one of its modules comes from."""
    modules = {type(submodule).__module__ for submodule in module.modules()}
    return [rewrite.group for rewrite in REWRITES if rewrite.modeling_module in modules]


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


def scatter_bool_value_as_int(scatter: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """`Tensor.scatter`/`scatter_` with a Python bool as its value, traced with the same value as an int (0 or 1).

    torch's tracer records a bool where the op takes a Scalar, and the TorchScript exporter's alias analysis then
    finds no schema for it (an internal assert): the sparse attention of DeepSeek-V3.2-like types builds its mask
    with `.scatter(-1, topk, False)`. Scattered into a bool tensor, 0 and 1 are False and True."""

    @functools.wraps(scatter)
    def scatter_with_int(self: torch.Tensor, dim: int, index: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if args and isinstance(args[0], bool):
            args = (int(args[0]), *args[1:])
        if isinstance(kwargs.get("value"), bool):
            kwargs["value"] = int(kwargs["value"])
        return scatter(self, dim, index, *args, **kwargs)

    return scatter_with_int


def causal_conv_padded_left(
    hidden_states: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """`causal_conv1d_fn` (transformers' PyTorch fallback) with the input padded on the left by kernel - 1 and a
    Conv1d without padding: output t sees inputs t - kernel + 1 .. t, as the both-sides-padded conv's first seq_len
    outputs do. Depthwise (one filter per channel, `weight` of shape (channels, kernel)), then the activation."""
    from transformers.activations import ACT2FN

    kernel = weight.shape[-1]
    padded = torch.nn.functional.pad(hidden_states.to(weight.dtype), (kernel - 1, 0))
    out = torch.nn.functional.conv1d(padded, weight.unsqueeze(1), bias, groups=hidden_states.shape[1])
    if activation is not None:
        out = ACT2FN[activation](out)
    return out.to(hidden_states.dtype)


class _ModelNoGrad:
    """How many `torch.no_grad()` blocks transformers' model code is in while it is exported (`counting_no_grad`)."""

    depth = 0


def counting_no_grad(replaced: type) -> type:
    """`torch.no_grad` while a model is exported: the same context, and a block that transformers' code enters (the
    caller's module) is counted in `_ModelNoGrad`. ORT exports, and runs its output-schema forward, under no_grad
    blocks of its own, so grad mode cannot tell the model's apart."""

    class no_grad(replaced):  # noqa: N801 - torch's name
        def __enter__(self) -> None:
            caller = sys._getframe(1).f_globals.get("__name__", "")
            self.counted = caller.startswith("transformers.")
            super().__enter__()
            _ModelNoGrad.depth += self.counted

        def __exit__(self, *exc: object) -> None:
            _ModelNoGrad.depth -= self.counted
            super().__exit__(*exc)

    return no_grad


class ZeroGradient(torch.autograd.Function):
    """The identity whose gradient is zero: what `detach` means inside an ONNX graph, which has no grad mode (ORT
    refuses a PythonOp gradient of None for an input it differentiates)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.detach().clone(memory_format=torch.contiguous_format)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(grad, memory_format=torch.contiguous_format)


def detached_under_model_no_grad(replaced: Callable[..., Any]) -> Callable[..., Any]:
    """A module's `forward` whose output gets no gradient when the model called it inside its own no_grad."""

    @functools.wraps(replaced)
    def forward(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        output = replaced(self, *args, **kwargs)
        return ZeroGradient.apply(output) if _ModelNoGrad.depth else output

    return forward
