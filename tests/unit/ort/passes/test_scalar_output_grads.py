"""A model's outputs whose gradient ORT only adds to its own (a causal LM's logits, its key/value cache) cost no
full-sized zeros in the backward when PyTorch gives them no gradient (ort_zero/ort/passes/scalar_output_grads.py),
and a gradient the caller does give still arrives: PyTorch's losses and gradients either way."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from ort_zero.foreign import onnxruntime as ort_internals
from ort_zero.ort.inspection import ort_run_record

VOCAB, SEQ = 4096, 32
Loss = Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]


def _llama() -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=64,
    )  # fmt: skip
    return LlamaForCausalLM._from_config(config)  # use_cache on: keys and values are outputs too


def _own_loss(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids, labels=ids).loss


def _loss_of_the_logits_too(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    outputs = model(input_ids=ids, labels=ids)
    return outputs.loss + outputs.logits.float().pow(2).mean()


@pytest.fixture
def zeros_made() -> Iterator[list[int]]:
    """The element counts of every `torch.zeros` made while the test runs (ORTModule's stand-ins for missing
    gradients are made with it)."""
    counts: list[int] = []
    zeros = torch.zeros

    def counting(*args: object, **kwargs: object) -> torch.Tensor:
        made = zeros(*args, **kwargs)
        counts.append(made.numel())
        return made

    torch.zeros = counting
    yield counts
    torch.zeros = zeros


def _steps(model: torch.nn.Module, loss_of: Loss, ids: torch.Tensor) -> list[tuple[float, dict]]:
    results = []
    for _ in range(2):
        model.zero_grad(set_to_none=True)
        loss = loss_of(model, ids)
        loss.backward()
        results.append((float(loss), {n: p.grad.clone() for n, p in model.named_parameters()}))
    return results


@pytest.mark.parametrize("loss_of", [_own_loss, _loss_of_the_logits_too], ids=["model's loss", "logits' loss too"])
def test_outputs_without_a_gradient_cost_no_zeros(enabled: None, zeros_made: list[int], loss_of: Loss) -> None:
    ortmodule = importlib.import_module("onnxruntime.training.ortmodule")
    torch.manual_seed(0)
    reference, model = _llama(), _llama()
    model.load_state_dict(reference.state_dict())
    ids = torch.randint(0, VOCAB, (2, SEQ))
    expected = _steps(reference, loss_of, ids)
    in_ort = ortmodule.ORTModule(model)
    zeros_made.clear()
    got = _steps(in_ort, loss_of, ids)

    assert ort_run_record(in_ort)["training"]["session"], "no ORT session: the model did not run in ORT"
    for (loss, grads), (expected_loss, expected_grads) in zip(got, expected, strict=True):
        assert loss == pytest.approx(expected_loss, rel=1e-5)
        for name, grad in expected_grads.items():
            torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-5)
    graph_info = ort_internals.execution_manager(in_ort, training=True)._graph_info
    assert len(graph_info.user_output_names) == 2 + 2 * 2, "loss, logits, and each layer's keys and values"
    assert graph_info.output_grad_indices_require_full_shape == [0], "only the loss (a scalar) asks for its shape"
    # before the pass: a zero tensor of the logits' size (2 x 32 x 4096) and of each layer's keys and values
    assert max(zeros_made, default=0) < 2 * SEQ * 32, zeros_made
