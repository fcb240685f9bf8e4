"""A language model's loss as torch's kernels in ORT's graph (ort_zero/ort/step/torch_kernels/cross_entropy.py): its
written-out backward gives torch's gradients (mean and sum, ignored rows); a LLaMA trains in ORT with PyTorch's loss
and gradients, its loss one PythonOp and no ONNX SoftmaxCrossEntropyLoss; other losses keep ORT's."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from ort_zero import patches
from ort_zero.foreign import onnxruntime as ort_internals
from ort_zero.ort.step.torch_kernels import CrossEntropyInTorch
from ort_zero.python_op import function_name, function_name_of

KERNEL = function_name(CrossEntropyInTorch)
TrainStep = Callable[..., dict]


@pytest.mark.parametrize("mean", [True, False])
def test_the_backward_is_torchs(mean: bool) -> None:
    torch.manual_seed(0)
    logits = torch.randn(12, 7, requires_grad=True)
    target = torch.randint(0, 7, (12,))
    target[[2, 5]] = -100
    expected = torch.nn.functional.cross_entropy(logits, target, reduction="mean" if mean else "sum")
    (expected_grad,) = torch.autograd.grad(expected * 3.0, logits)
    got = CrossEntropyInTorch.apply(logits, target, -100, mean)
    (grad,) = torch.autograd.grad(got * 3.0, logits)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(grad, expected_grad)
    assert grad[[2, 5]].abs().sum() == 0


def test_every_row_ignored_gives_no_gradient() -> None:
    logits = torch.randn(3, 4, requires_grad=True)
    loss = CrossEntropyInTorch.apply(logits, torch.full((3,), -100), -100, False)
    (grad,) = torch.autograd.grad(loss, logits)
    assert float(loss) == 0 and grad.abs().sum() == 0


def _llama() -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        max_position_embeddings=64,
    )  # fmt: skip
    return LlamaForCausalLM._from_config(config, attn_implementation="eager")


def test_a_causal_lm_loss_runs_in_torch(train_step: TrainStep) -> None:
    result = train_step(_llama, ("torch_kernels",))
    graph = ort_internals.optimized_model(ort_internals.execution_manager(result["model"], training=True)).graph
    assert [function_name_of(node) for node in graph.node].count(KERNEL) == 1
    assert not [node.op_type for node in graph.node if "SoftmaxCrossEntropy" in node.op_type]


class ClassWeighted(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        target = torch.tensor([0, 3, -100, 4])
        weight = torch.tensor([1.0, 2.0, 0.5, 1.0, 1.5])
        return torch.nn.functional.cross_entropy(self.linear(x), target, weight=weight)


def test_other_losses_keep_orts(trains_as_pytorch: Callable) -> None:
    with patches.applied("torch_kernels"):
        record = trains_as_pytorch(ClassWeighted)
    assert KERNEL not in record["python_ops"]


@pytest.mark.parametrize("mean", [True, False])
def test_the_trace_computes_no_softmax_of_zero_logits(monkeypatch: pytest.MonkeyPatch, mean: bool) -> None:
    """While a ZeRO-3 model is exported its logits are the stand-ins' zeros: the loss torch gives them, without the
    log-softmax (0.04-0.08 s of a trace); logits that are not zeros get torch's."""
    from ort_zero.hooks.export_mode import exporting

    target = torch.tensor([3, -100, 7, 0])
    calls: list[int] = []
    log_softmax = torch.log_softmax
    monkeypatch.setattr(torch, "log_softmax", lambda *a, **k: calls.append(1) or log_softmax(*a, **k))
    zeros, logits = torch.zeros(4, 11), torch.randn(4, 11)
    with exporting():
        traced = CrossEntropyInTorch.apply(zeros, target, -100, mean)
        assert calls == []
        computed = CrossEntropyInTorch.apply(logits, target, -100, mean)
        assert calls == [1]
    reduction = "mean" if mean else "sum"
    torch.testing.assert_close(traced, torch.nn.functional.cross_entropy(zeros, target, reduction=reduction))
    torch.testing.assert_close(computed, torch.nn.functional.cross_entropy(logits, target, reduction=reduction))
