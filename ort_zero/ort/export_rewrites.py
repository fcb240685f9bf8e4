"""Model code that ONNX cannot express, replaced by an equivalent while ORTModule exports a model that runs it.

An op-level override (`export_overrides`) cannot help where a model computes in a dtype ONNX lacks: Llama 4 turns its
rotary embedding into complex numbers (`torch.polar`, `view_as_complex`), and ONNX has no complex tensors. For such
a model the functions themselves are replaced during the export by ones that compute the same values in real
arithmetic; PyTorch runs of the same model keep transformers' own. The same mechanism replaces MoE layers that route
tokens in Python (DBRX, JetMoE, LongCat-Flash), whose routing a trace would keep as constants, by batched ones. Each
rewrite is a patch group in `ort_zero.patches` (with the transformers versions it was written for), applied only
while a ZeRO-3 model whose modules come from that modeling file is exported.
"""

from __future__ import annotations

import functools
import inspect
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
CPMANT = ModelRewrite(
    "export_cpmant",
    "transformers.models.cpmant.modeling_cpmant",
    ("cpmant",),
    "CPM-Ant builds its attention mask from `context`, an int64 tensor of ones, or-ed with bool masks (`int | bool`): "
    "torch exports a bitwise or of ints at no opset ORT 1.19.2 trains (ONNX's Or takes bools; the exporter refuses, "
    "SymbolicValueError): while it is exported the mask is built from `context != 0`, whose masks are true where "
    "the int ones are nonzero, which is all the attention reads of them (`mask == False`)",
)
REFORMER = ModelRewrite(
    "export_reformer",
    "transformers.models.reformer.modeling_reformer",
    ("reformer",),
    "Reformer's reversible layers run in an autograd Function (`_ReversibleFunction`, a PythonOp in ORT's graph) "
    "whose backward returns 12 gradients for its 11 inputs (a trailing None): PyTorch drops extra Nones, ORT's "
    "PythonOpGrad stops the backward (outputs sizes 11 vs 12). ORT takes the backward the exporter registers: "
    "while the model is exported it is one that returns one gradient per input",
)
DBRX = ModelRewrite(
    "export_dbrx",
    "transformers.models.dbrx.modeling_dbrx",
    ("dbrx",),
    "DBRX's experts loop in Python over the experts the batch routes to (nonzero, then torch.where per expert), so "
    "the trace keeps the traced batch's routing as constants (ORT's Split fails on the next batch): while it is "
    "exported, each (token, expert) pair gathers its expert's weights and runs one batched matmul, as transformers' "
    "batched_mm experts do (the same values and gradients)",
)
JETMOE = ModelRewrite(
    "export_jetmoe",
    "transformers.models.jetmoe.modeling_jetmoe",
    ("jetmoe",),
    "JetMoE's experts split their sorted rows by tokens per expert made Python ints (expert_size.tolist()), which "
    "the trace keeps as constants (ORT's Reshape fails in the backward on the next batch): while it is exported, "
    "the gate hands on the expert of each sorted row instead, and each row gathers its expert's weight for one "
    "batched matmul (the same values and gradients). Its tokens are summed back with Tensor.index_add, which torch's "
    "exporter writes as a scatter that keeps one of the rows sent to the same token instead of their sum: while "
    "JetMoE is exported, index_add sums through a one-hot matrix",
)
LONGCAT_FLASH = ModelRewrite(
    "export_longcat_flash",
    "transformers.models.longcat_flash.modeling_longcat_flash",
    ("longcat_flash",),
    "LongCat-Flash's experts loop in Python over the experts the batch routes to (nonzero, .item(), torch.where) "
    "and squeeze(0) each expert's (top_k, tokens) mask, a no-op in PyTorch that the exporter writes as a Squeeze "
    "of a dimension of top_k (ORT's symbolic shape inference asserts; the node could not run either): while it is "
    "exported, each (token, expert) pair gathers its expert's weights for batched matmuls, and pairs routed to a "
    "zero-compute expert keep their input (the same values and gradients)",
)
PHIMOE = ModelRewrite(
    "export_phimoe",
    "transformers.models.phimoe.modeling_phimoe",
    ("phimoe",),
    "PhiMoE's router multiplies by PhimoeMultiplier, an autograd Function whose backward gives a gradient to the "
    "scores only, though the multiplier (a GatherElements of the softmax) and the softmax it is also given require "
    "one: ORT's PythonOp gradient then leaves those gradients unset, and the GatherElements gradient fails on its "
    "missing input; and ORT's gradient of the Mul that broadcasts the Function's output (a PythonOp output has no "
    "shape for it) does not reduce the broadcast. While it is exported, the Function's backward returns zeros for "
    "those inputs (what torch's None means) and its output is declared to have the multiplier's shape",
)
BLT = ModelRewrite(
    "export_blt",
    "transformers.models.blt.modeling_blt",
    ("blt",),
    "BLT's hash embeddings hash byte groups with powers of large primes, `prime ** arange(group)` on int64, which "
    "wraps around as it overflows; torch exports it as Pow, and ORT 1.19.2's int64 Pow computes in floating point "
    "(1000000007**2 is 1000000014000000000, not ...049; an overflow saturates where torch wraps): every hash id "
    "differed, so every hash embedding row read was another. While it is exported the powers are computed at "
    "export time, wrapped as torch wraps them, and the graph gets them as a constant",
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
REWRITES = (
    LLAMA4, DEEPSEEK_V2, CPMANT, REFORMER, DBRX, JETMOE, LONGCAT_FLASH, PHIMOE, BLT, HRM_TEXT,
)  # fmt: skip


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


def mask_from_bool_context(prepare: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """CPM-Ant's `_prepare_attention_mask(input_ids, span, context, length)` with `context != 0` for `context`: the
    int mask's or/and with bool masks become ops on bools, true where the int mask is nonzero."""

    @functools.wraps(prepare)
    def prepare_from_bools(
        self: Any, input_ids: torch.Tensor, span: torch.Tensor, context: torch.Tensor, length: torch.Tensor
    ) -> torch.Tensor:
        return prepare(self, input_ids, span, context != 0, length)

    return prepare_from_bools


def one_gradient_per_input(backward: staticmethod, forward: Callable[..., Any]) -> staticmethod:
    """An autograd Function's `backward` that returns one gradient per input of its `forward` (whose first argument
    is ctx): trailing Nones beyond them are dropped, as PyTorch drops them; a gradient there is an error."""
    inputs = len(inspect.signature(forward).parameters) - 1

    @functools.wraps(backward.__func__)
    def backward_per_input(ctx: Any, *grads: Any) -> tuple[Any, ...]:
        result = backward.__func__(ctx, *grads)
        result = result if isinstance(result, tuple) else (result,)
        if any(extra is not None for extra in result[inputs:]):
            raise RuntimeError(f"{backward.__func__.__qualname__} returned gradients beyond its {inputs} inputs")
        return result[:inputs]

    return staticmethod(backward_per_input)


def dbrx_experts_batched(
    self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """`DbrxExperts.forward` without routing in Python: every token repeated once per chosen expert, the GLU of
    that expert (weights gathered by index) in batched matmuls, weighted and summed back per token."""
    batch_size, hidden = hidden_states.shape[0], self.hidden_size
    tokens = hidden_states.reshape(-1, hidden)
    top_k = top_k_index.shape[-1]
    pairs = tokens.unsqueeze(1).expand(-1, top_k, -1).reshape(-1, 1, hidden)  # (tokens * top_k, 1, hidden)
    experts = top_k_index.reshape(-1)
    shape = (self.num_experts, self.ffn_hidden_size, hidden)
    w1, v1, w2 = (weight.view(shape)[experts] for weight in (self.mlp.w1, self.mlp.v1, self.mlp.w2))
    gated = self.mlp.activation_fn(pairs @ w1.transpose(1, 2)) * (pairs @ v1.transpose(1, 2))
    out = (gated @ w2).reshape(-1, hidden) * top_k_weights.reshape(-1, 1)
    return out.view(-1, top_k, hidden).sum(dim=1).view(batch_size, -1, hidden)


def longcat_flash_experts_batched(
    self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """`LongcatFlashExperts.forward` without routing in Python: every token repeated once per chosen expert; a pair
    routed to one of the real experts (index below `num_routed_experts`) runs its GLU with gathered weights, one
    routed to a zero-compute expert keeps its input; weighted and summed back per token."""
    top_k, hidden = top_k_index.shape[-1], hidden_states.shape[-1]
    pairs = hidden_states.unsqueeze(1).expand(-1, top_k, -1).reshape(-1, hidden)
    experts = top_k_index.reshape(-1)
    out = pairs
    if self.gate_up_proj is not None:
        real = experts.clamp(max=self.num_routed_experts - 1)  # any real expert for the zero-compute pairs
        gate, up = (pairs.unsqueeze(1) @ self.gate_up_proj[real].transpose(1, 2)).chunk(2, dim=-1)
        computed = ((self.act_fn(gate) * up) @ self.down_proj[real].transpose(1, 2)).squeeze(1)
        out = torch.where((experts < self.num_routed_experts).unsqueeze(1), computed, pairs)
    out = out * top_k_weights.reshape(-1, 1)
    return out.view(-1, top_k, hidden).sum(dim=1).to(hidden_states.dtype)


def jetmoe_gating_experts_of_rows(self: Any, hidden_states: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """`JetMoeTopKGating.forward` handing on, where transformers hands the tokens per expert (a list of ints), the
    expert of each row sorted by expert (a tensor; the experts' forward is the only reader): the rows' order, the
    token and gate of each row, their experts and the router logits."""
    logits = self.layer(hidden_states).float()
    top_logits, top_experts = logits.topk(self.top_k, dim=1)
    gates = torch.softmax(top_logits, dim=1).type_as(hidden_states).flatten()
    experts_of_rows, order = top_experts.flatten().sort(0)
    return order, order.div(self.top_k, rounding_mode="trunc"), gates[order], experts_of_rows, logits


def jetmoe_experts_by_row(self: Any, inputs: torch.Tensor, experts_of_rows: torch.Tensor) -> torch.Tensor:
    """`JetMoeParallelExperts.forward` on rows sorted by expert, each multiplied by its expert's (gathered) weight
    in one batched matmul."""
    return (self.weight[experts_of_rows] @ inputs.unsqueeze(-1)).squeeze(-1)


def index_add_by_one_hot(index_add: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """`Tensor.index_add` as a sum through a one-hot matrix (destination rows by source rows), which exports as a
    MatMul: torch's exporter writes index_add as a scatter that is wrong wherever `index` repeats (it warns so)."""

    @functools.wraps(index_add)
    def index_add_summed(
        self: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor, *, alpha: float = 1
    ) -> torch.Tensor:
        first_column = self.movedim(dim, 0).unsqueeze(-1).flatten(1)[:, 0]
        rows = torch.ones_like(first_column, dtype=torch.long).cumsum(0) - 1  # 0 .. rows - 1, from data, not a size
        one_hot = (rows.unsqueeze(1) == index).to(source.dtype)  # (destination rows, source rows)
        moved = source.movedim(dim, 0)
        added = (one_hot @ moved.reshape(moved.shape[0], -1)).reshape(-1, *moved.shape[1:]).movedim(0, dim)
        return self + (added if alpha == 1 else alpha * added)

    return index_add_summed


@functools.cache  # one class per Function: ORT registers a PythonOp's Function by its name at each export
def with_zero_gradients(
    function: type[torch.autograd.Function], shaped_like_input: int | None = None
) -> type[torch.autograd.Function]:
    """An autograd Function that runs `function`'s forward and backward, and returns zeros where `function`'s
    backward returns None for a floating-point input that requires a gradient. ORT gives a PythonOp a gradient
    output for every input on a differentiable path (whatever the backward returns, and through a detach, which the
    export drops) and leaves it unset when the backward returns None: the gradient node that reads it fails on a
    missing input. Zeros are what torch's None means, so the gradients are the same.

    With `shaped_like_input`, ORT is told that the output has that input's shape and type (`infer_shape`): without a
    shape for a PythonOp's output, ORT's gradient of a broadcasting Mul that reads it does not reduce the broadcast
    dimensions, and the Function's backward receives a gradient of the broadcast shape."""

    def forward(ctx: Any, *args: Any) -> Any:
        ctx.ort_zero_inputs = [
            (arg.shape, arg.dtype, arg.device) if isinstance(arg, torch.Tensor) and arg.is_floating_point() else None
            for arg in args
        ]
        return function.forward(ctx, *args)

    def backward(ctx: Any, *grads: Any) -> Any:
        results = function.backward(ctx, *grads)
        results = results if isinstance(results, tuple) else (results,)
        return tuple(
            torch.zeros(meta[0], dtype=meta[1], device=meta[2])
            if result is None and meta is not None and wanted
            else result
            for result, meta, wanted in zip(results, ctx.ort_zero_inputs, ctx.needs_input_grad, strict=True)
        )

    def infer_shape(node: Any, shapes: list, dtypes: list) -> tuple[list, list]:
        return [shapes[shaped_like_input]], [dtypes[shaped_like_input]]

    members = {"forward": staticmethod(forward), "backward": staticmethod(backward)}
    if shaped_like_input is not None:
        members["infer_shape"] = staticmethod(infer_shape)
    # a direct subclass of Function: ORT registers no other kind of class for a PythonOp
    return type(f"{function.__name__}WithZeroGradients", (torch.autograd.Function,), members)


def phimoe_multiplier(multiplier: type[torch.autograd.Function]) -> type[torch.autograd.Function]:
    """`PhimoeMultiplier(scores, multiplier, selected_experts, masked_gates, mask_for_one)` returns `multiplier *
    mask_for_one` (the same shape as the multiplier); its backward gives a gradient to the scores only."""
    return with_zero_gradients(multiplier, shaped_like_input=1)


def rolling_polynomial_hash_with_constant_powers(token_tensor: torch.Tensor, prime: int = 1000000007) -> torch.Tensor:
    """transformers' BLT `rolling_polynomial_hash`: sum of token_i * prime**i over the last dimension, in int64 as
    torch computes it (every product wraps modulo 2**64), with the powers computed here instead of by a Pow in the
    graph. The group size (the last dimension) is a constant of the export (BLT's unfold window)."""
    powers, power = [], 1
    for _ in range(int(token_tensor.shape[-1])):
        powers.append(power - 2**64 if power >= 2**63 else power)
        power = power * prime % 2**64
    weights = torch.tensor(powers, dtype=torch.int64, device=token_tensor.device)
    return torch.sum(token_tensor * weights, dim=-1)


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
