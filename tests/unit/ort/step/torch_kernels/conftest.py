"""What the torch-kernel tests share: a tiny causal LM trained in PyTorch and in an ORTModule (fallback off,
the kernels' patch group applied around the export as a ZeRO-3 export applies it), and the forward values ORT's
training graph keeps for the backward."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from ort_zero import patches
from ort_zero.foreign import onnxruntime as ort_internals
from ort_zero.ort.graph.training_graph import TrainingGraphView
from ort_zero.ort.inspection import ort_run_record


def _steps(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> list[tuple[float, dict]]:
    """Two forward-backward passes: ORT copies every PythonOp input at its first run only, so the second shows
    whether a kernel keeps an input ORT then reuses."""
    results = []
    for _ in range(2):
        model.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, attention_mask=mask, labels=ids).loss
        loss.backward()
        results.append((float(loss), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    return results


def kept_for_backward(model: torch.nn.Module) -> list[tuple[str, str, list]]:
    """(value, producing op, shape) of every forward value ORT's training graph reads in the backward."""
    graph = ort_internals.optimized_model(ort_internals.execution_manager(model, training=True)).graph
    shapes = {
        v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in [*graph.value_info, *graph.input, *graph.output]
    }
    view = TrainingGraphView(graph)
    return [
        (out, view.nodes[i].op_type, shapes.get(out, []))
        for i in view.forward
        for out in view.nodes[i].output
        if out and any(c in view.backward_set for c in view.consumers.get(out, ()))
    ]


@pytest.fixture
def train_step(enabled: None) -> Callable[..., dict]:
    """`train_step(make_model, groups, seq=..., padded=...)`: two steps of two copies of `make_model()` in PyTorch and
    in an ORTModule exported with the patch `groups` applied; losses and gradients agree (ORT ran); returns the ORT
    model, its run record and what its graph keeps for the backward."""
    ortmodule = importlib.import_module("onnxruntime.training.ortmodule")

    def check(make_model: Callable[[], torch.nn.Module], groups: tuple[str, ...], seq: int = 24, padded: bool = True):
        torch.manual_seed(0)
        reference, model = make_model(), make_model()
        model.load_state_dict(reference.state_dict())
        ids = torch.randint(0, reference.config.vocab_size, (2, seq))
        mask = torch.ones_like(ids)
        if padded:
            mask[1, : seq // 4] = 0  # left padding: a mask the causal flag alone cannot express
        expected = _steps(reference, ids, mask)
        in_ort = ortmodule.ORTModule(model)
        with contextlib.ExitStack() as stack:
            for group in groups:
                stack.enter_context(patches.applied(group))
            got = _steps(in_ort, ids, mask)
        record = ort_run_record(in_ort)["training"]
        assert record["session"], "no ORT session: the model did not run in ORT"
        for (loss, grads), (expected_loss, expected_grads) in zip(got, expected, strict=True):
            assert loss == pytest.approx(expected_loss, rel=1e-5)
            assert grads.keys() == expected_grads.keys()
            for name, grad in expected_grads.items():
                torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-5)
        return {"model": in_ort, "record": record, "kept": kept_for_backward(in_ort)}

    return check


@pytest.fixture
def tiny_llama() -> Callable[..., LlamaForCausalLM]:
    """`tiny_llama(attn, layers=2, **config)`: a LLaMA of hidden 32 from config (grouped-query attention, RMSNorm,
    rotary, SwiGLU MLP) with the attention implementation `attn`; `config` overrides the config's fields."""

    def make(attn: str = "eager", layers: int = 2, **config: object) -> LlamaForCausalLM:
        fields = dict(
            vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64,
        )  # fmt: skip
        return LlamaForCausalLM._from_config(LlamaConfig(**fields | config), attn_implementation=attn)

    return make


@pytest.fixture
def llama_in_ort(enabled: None, tiny_llama: Callable[..., LlamaForCausalLM]) -> Callable[..., tuple[dict, object]]:
    """`llama_in_ort(dtype, layers)`: two steps of a tiny sdpa LLaMA in `dtype`, in PyTorch and in an ORTModule
    exported with the torch kernels' patch group (the second step: a kept input ORT reused would show); losses and
    gradients agree (bf16: a few units of its 8-bit mantissa) and an ORT session ran. Returns the training graph's run
    record and the graph ORT optimized."""
    ortmodule = importlib.import_module("onnxruntime.training.ortmodule")

    def step(model: torch.nn.Module, ids: torch.Tensor) -> tuple[float, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        return float(loss.detach()), {n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None}

    def check(dtype: torch.dtype, layers: int) -> tuple[dict, object]:
        torch.manual_seed(0)
        reference = tiny_llama("sdpa", layers=layers).to(dtype)
        model = tiny_llama("sdpa", layers=layers).to(dtype)
        model.load_state_dict(reference.state_dict())
        ids = torch.randint(0, 96, (2, 24))
        in_ort = ortmodule.ORTModule(model)
        with patches.applied("torch_kernels"):
            got = [step(in_ort, ids) for _ in range(2)]
        expected = [step(reference, ids) for _ in range(2)]
        record = ort_run_record(in_ort)["training"]
        assert record["session"], "no ORT session: the model did not run in ORT"
        sixteen = dtype == torch.bfloat16
        rtol, atol = (5e-2, 5e-3) if sixteen else (1e-4, 1e-5)
        for (loss, grads), (expected_loss, expected_grads) in zip(got, expected, strict=True):
            assert loss == pytest.approx(expected_loss, rel=1e-2 if sixteen else 1e-5)
            assert grads.keys() == expected_grads.keys()
            for name, grad in expected_grads.items():
                torch.testing.assert_close(grads[name], grad, rtol=rtol, atol=atol)
        return record, ort_internals.optimized_model(ort_internals.execution_manager(in_ort, training=True)).graph

    return check
