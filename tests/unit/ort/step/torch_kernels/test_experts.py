"""Mixture-of-experts blocks as torch's own computation in ORT's graph (ort_zero/ort/step/torch_kernels/experts.py): a
Qwen3-MoE with transformers' default experts implementation (grouped_mm, whose torch.histc the exporter cannot write)
and with eager trains in ORT with PyTorch's loss and gradients, its experts in one PythonOp per layer, ORT keeping
nothing of them for the backward; exported as batched_mm without the kernel, ORT keeps every (token, expert) pair's
copy of the expert weights, per layer."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from ort_zero.ort.step.torch_kernels import ExpertsInTorch
from ort_zero.python_op import function_name

KERNEL = function_name(ExpertsInTorch)
TrainStep = Callable[..., dict]
LAYERS = 2


def _moe(experts: str) -> Callable[[], Qwen3MoeForCausalLM]:
    config = Qwen3MoeConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=2, num_experts=8, num_experts_per_tok=2, use_cache=False,
        max_position_embeddings=64,
    )  # fmt: skip
    return lambda: Qwen3MoeForCausalLM._from_config(config, attn_implementation="eager", experts_implementation=experts)


def experts_values(kept: list[tuple[str, str, list]]) -> list[tuple[str, str, list]]:
    """The experts' tensors ORT keeps (a PythonOp's autograd context, which torch's graph holds, not counted)."""
    return [value for value in kept if "/experts/" in value[0] and not value[0].endswith("_ctx")]


@pytest.mark.parametrize("experts", ["grouped_mm", "eager"])
def test_moe_trains_in_ort_with_its_experts_in_torch(train_step: TrainStep, experts: str) -> None:
    result = train_step(_moe(experts), ("torch_kernels_experts",))
    assert KERNEL in result["record"]["python_ops"]
    assert experts_values(result["kept"]) == []


def test_batched_mm_without_the_kernel_keeps_weights_per_token_and_expert(train_step: TrainStep) -> None:
    result = train_step(_moe("batched_mm"), ())
    assert KERNEL not in result["record"]["python_ops"]
    gathered = [value for value in experts_values(result["kept"]) if value[1] == "Gather" and len(value[2]) == 3]
    assert len({name.split("/mlp/")[0] for name, _, _ in gathered}) == LAYERS, gathered


def test_the_trace_runs_no_expert_on_stand_ins() -> None:
    """While a ZeRO-3 model is exported its partitioned weights are zeros, and so is what the experts compute with
    them: the trace gets zeros without the grouped matmuls (the implementation is not called)."""
    import torch
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
    from transformers.integrations.moe import grouped_mm_experts_forward

    from ort_zero.ort.export.context import stood_in_for_export

    experts = _moe("grouped_mm")().to(torch.bfloat16).model.layers[0].mlp.experts  # a bf16 model
    params = list(experts.parameters(recurse=False))
    for param in params:
        param.ds_status, param.ds_numel, param.ds_shape = ZeroParamStatus.NOT_AVAILABLE, param.numel(), param.shape
    hidden = torch.randn(6, 32, dtype=torch.bfloat16)
    index, weights = torch.randint(0, 8, (6, 2)), torch.rand(6, 2, dtype=torch.bfloat16)
    calls: list[int] = []

    def implementation(*args: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return grouped_mm_experts_forward(*args)

    with stood_in_for_export(experts):
        traced = ExpertsInTorch.apply(hidden, index, weights, experts, implementation, *params)
        computed = grouped_mm_experts_forward(experts, hidden, index, weights)  # on the zeros themselves
    assert calls == []
    assert traced.dtype == computed.dtype == hidden.dtype
    torch.testing.assert_close(traced, computed, rtol=0, atol=0)
