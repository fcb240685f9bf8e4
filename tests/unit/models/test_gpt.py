"""The repository's GPT: shapes, the tied LM head, causality, and a clean ONNX export (what ORTModule needs)."""

from __future__ import annotations

import io

import onnx
import pytest
import torch

from ort_zero.models import GPT, GPTConfig

SMALL = GPTConfig(n_layer=2, n_head=4, d_model=32, max_seq=16)


@pytest.fixture
def model() -> GPT:
    torch.manual_seed(0)
    return GPT(SMALL).eval()


def test_shapes_and_loss(model: GPT) -> None:
    ids = torch.randint(0, SMALL.vocab_size, (3, 10))
    out = model(ids)
    assert set(out) == {"logits"}
    assert out["logits"].shape == (3, 10, SMALL.vocab_size)
    out = model(ids, labels=ids)
    expected = torch.nn.functional.cross_entropy(out["logits"].reshape(-1, SMALL.vocab_size), ids.reshape(-1))
    assert out["loss"].shape == ()
    assert torch.allclose(out["loss"], expected)


def test_lm_head_is_the_token_embedding(model: GPT) -> None:
    assert model.lm_head.weight is model.wte.weight
    names = [name for name, _ in model.named_parameters()]
    assert "wte.weight" in names and "lm_head.weight" not in names  # one parameter, listed once


def test_later_tokens_do_not_change_earlier_logits(model: GPT) -> None:
    ids = torch.randint(0, SMALL.vocab_size, (2, 12))
    changed = ids.clone()
    changed[:, 7:] = (changed[:, 7:] + 1) % SMALL.vocab_size
    before, after = model(ids)["logits"], model(changed)["logits"]
    torch.testing.assert_close(before[:, :7], after[:, :7], rtol=0, atol=0)
    assert not torch.allclose(before[:, 7:], after[:, 7:]), "the changed tokens had no effect: the check is vacuous"


def test_dropout_is_configurable() -> None:
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, d_model=16, max_seq=8, dropout=0.5)).train()
    ids = torch.randint(0, 256, (2, 8))
    assert not torch.equal(model(ids)["logits"], model(ids)["logits"])
    model.eval()
    assert torch.equal(model(ids)["logits"], model(ids)["logits"])


def test_rejects_width_not_divisible_by_heads() -> None:
    with pytest.raises(ValueError, match="multiple of n_head"):
        GPTConfig(d_model=30, n_head=4)


def test_onnx_export_with_dynamic_batch_and_sequence(model: GPT) -> None:
    import onnxruntime

    ids = torch.randint(0, SMALL.vocab_size, (2, 8))
    buffer = io.BytesIO()
    torch.onnx.export(
        model, (ids,), buffer, opset_version=17, input_names=["input_ids"], output_names=["logits"],
        dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}}, dynamo=False,
    )  # fmt: skip
    graph = onnx.load_from_string(buffer.getvalue())
    onnx.checker.check_model(graph)
    ops = {node.op_type for node in graph.graph.node}
    assert {"MatMul", "Softmax"} <= ops
    session = onnxruntime.InferenceSession(buffer.getvalue(), providers=["CPUExecutionProvider"])
    other = torch.randint(0, SMALL.vocab_size, (3, 13))  # another batch size and length than the traced ones
    (logits,) = session.run(None, {"input_ids": other.numpy()})
    with torch.no_grad():
        expected = model(other)["logits"].numpy()
    assert logits.shape == expected.shape
    assert abs(logits - expected).max() < 1e-4


def forward_backward(model: GPT, ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor], list[int]]:
    """Loss, parameter gradients and, per block, how many times it ran (a checkpointed block runs again in backward)."""
    calls = [0] * len(model.blocks)
    handles = [
        # A pre-hook: the recompute stops as soon as it has what the backward needs, before forward hooks would run.
        block.register_forward_pre_hook(lambda *_, index=index: calls.__setitem__(index, calls[index] + 1))
        for index, block in enumerate(model.blocks)
    ]
    torch.manual_seed(1)  # the same dropout masks in both models
    loss = model(ids, labels=ids.roll(-1, dims=1))["loss"]
    loss.backward()
    for handle in handles:
        handle.remove()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters()}, calls


def test_gradient_checkpointing_recomputes_each_block_and_changes_no_number() -> None:
    config = GPTConfig(n_layer=3, n_head=2, d_model=16, max_seq=12, dropout=0.2)  # dropout: masks must be redrawn equal
    torch.manual_seed(0)
    plain = GPT(config).train()
    checkpointed = GPT(GPTConfig(**{**vars(config), "gradient_checkpointing": True})).train()
    checkpointed.load_state_dict(plain.state_dict())
    ids = torch.randint(0, config.vocab_size, (2, 12))
    loss, grads, plain_calls = forward_backward(plain, ids)
    ckpt_loss, ckpt_grads, ckpt_calls = forward_backward(checkpointed, ids)
    assert plain_calls == [1, 1, 1] and ckpt_calls == [2, 2, 2]  # the checkpoint really ran each block again
    torch.testing.assert_close(ckpt_loss, loss, rtol=0, atol=0)
    assert grads.keys() == ckpt_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(ckpt_grads[name], grad, rtol=0, atol=0, msg=name)


def test_gradient_checkpointing_is_off_in_eval() -> None:
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, d_model=16, max_seq=8, gradient_checkpointing=True))
    _, _, calls = forward_backward(model.eval(), torch.randint(0, 256, (1, 8)))
    assert calls == [1, 1]


def test_gradient_checkpointing_runs_under_no_grad_in_training(monkeypatch: pytest.MonkeyPatch) -> None:
    """ORTModule exports a training model under no_grad: the checkpoint must be called there too, so that ort_zero
    sees it (and puts its layer-wise recompute in its place, or refuses it at level 0)."""
    calls = []
    checkpoint = torch.utils.checkpoint.checkpoint
    monkeypatch.setattr(torch.utils.checkpoint, "checkpoint", lambda *a, **k: calls.append(1) or checkpoint(*a, **k))
    model = GPT(GPTConfig(n_layer=2, n_head=2, d_model=16, max_seq=8, gradient_checkpointing=True)).train()
    with torch.no_grad():
        model(torch.randint(0, 256, (1, 8)))
    assert len(calls) == 2
