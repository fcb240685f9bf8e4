"""Model code rewritten while ort_zero exports it gives transformers' values: Llama 4's and DeepSeek-V2's rotary
embeddings in real arithmetic (in place of complex numbers), a scattered Python bool traced as an int (torch's
exporter asserts on the bool), PhiMoE's multiplier Function with zeros for its None gradients, BLT's hash with its
prime powers computed at export; each model rewrite applies to the models built from its modeling file only."""

from __future__ import annotations

import contextlib
import importlib
from typing import Any

import pytest
import torch

import ort_zero  # noqa: F401  (before ORT: makes ORTModule importable on today's torch)
from ort_zero.ort import export_rewrites
from ort_zero.ort.inspection import ort_run_record

llama4 = pytest.importorskip("transformers.models.llama4.modeling_llama4")
deepseek_v2 = pytest.importorskip("transformers.models.deepseek_v2.modeling_deepseek_v2")


def rotary(config_kwargs: dict) -> torch.nn.Module:
    from transformers import Llama4TextConfig

    config = Llama4TextConfig(hidden_size=32, num_attention_heads=4, head_dim=8, **config_kwargs)
    return llama4.Llama4TextRotaryEmbedding(config)


def test_the_real_rotary_embedding_gives_transformers_values() -> None:
    module = rotary({})
    x, positions = torch.randn(2, 5, 32), torch.arange(5).expand(2, 5)
    complex_freqs = module(x, positions)
    pairs = export_rewrites.rotary_pairs(module, x, positions)
    torch.testing.assert_close(pairs, torch.view_as_real(complex_freqs))
    xq, xk = torch.randn(2, 5, 4, 8), torch.randn(2, 5, 2, 8)
    expected = llama4.apply_rotary_emb(xq, xk, complex_freqs)
    for got, want in zip(export_rewrites.llama4_rotate_pairs(xq, xk, pairs), expected, strict=True):
        torch.testing.assert_close(got, want)


def test_the_real_deepseek_v2_rotary_embedding_gives_transformers_values() -> None:
    from transformers import DeepseekV2Config

    module = deepseek_v2.DeepseekV2RotaryEmbedding(DeepseekV2Config(hidden_size=32, num_attention_heads=4))
    x, positions = torch.randn(2, 5, 32), torch.arange(5).expand(2, 5)
    complex_freqs = module(x, positions)
    pairs = export_rewrites.rotary_pairs(module, x, positions)
    torch.testing.assert_close(pairs, torch.view_as_real(complex_freqs))
    channels = 2 * pairs.shape[-2]  # the rotary part of each head (qk_rope_head_dim)
    xq, xk = torch.randn(2, 4, 5, channels), torch.randn(2, 1, 5, channels)  # batch, head, position, channel
    expected = deepseek_v2.apply_rotary_emb(xq, xk, complex_freqs)
    for got, want in zip(export_rewrites.deepseek_v2_rotate_pairs(xq, xk, pairs), expected, strict=True):
        torch.testing.assert_close(got, want)


def test_each_rewrite_applies_to_its_models_only() -> None:
    assert export_rewrites.groups_for(torch.nn.Sequential(rotary({}))) == [export_rewrites.LLAMA4.group]
    config = deepseek_v2.DeepseekV2Config(hidden_size=32, num_attention_heads=4)
    deepseek = deepseek_v2.DeepseekV2RotaryEmbedding(config)
    assert export_rewrites.groups_for(torch.nn.Sequential(deepseek)) == [export_rewrites.DEEPSEEK_V2.group]
    assert export_rewrites.groups_for(torch.nn.Sequential(torch.nn.Linear(2, 2))) == []


class MaskedByTopK(torch.nn.Module):
    """DeepSeek-V3.2's sparse-attention mask: True everywhere but at each row's top-k, set with a scattered bool."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.linear(x)
        top = scores.topk(2, dim=-1).indices
        mask = top.new_ones(scores.shape, dtype=torch.bool).scatter(-1, top, False)
        return scores.masked_fill(mask, 0.0).square().sum()


def test_a_scattered_bool_gives_the_same_values_as_an_int() -> None:
    mask, index = torch.ones(2, 5, dtype=torch.bool), torch.tensor([[0, 3], [1, 4]])
    scatter = export_rewrites.scatter_bool_value_as_int(torch.Tensor.scatter)
    scatter_ = export_rewrites.scatter_bool_value_as_int(torch.Tensor.scatter_)
    torch.testing.assert_close(scatter(mask, -1, index, False), mask.scatter(-1, index, False))
    torch.testing.assert_close(scatter(mask, -1, index, value=False), mask.scatter(-1, index, False))
    torch.testing.assert_close(scatter_(mask.clone(), 1, index, False), mask.scatter(1, index, False))


@pytest.mark.parametrize("rewritten", [False, True])
def test_a_scattered_bool_exports_only_as_an_int(monkeypatch: pytest.MonkeyPatch, rewritten: bool) -> None:
    ortmodule = importlib.import_module("onnxruntime.training.ortmodule")
    monkeypatch.setenv("ORTMODULE_FALLBACK_POLICY", "FALLBACK_DISABLE")
    if rewritten:  # what the patch does while ORTModule exports a ZeRO-3 model
        monkeypatch.setattr(torch.Tensor, "scatter", export_rewrites.scatter_bool_value_as_int(torch.Tensor.scatter))
    torch.manual_seed(0)
    model, x = MaskedByTopK(), torch.randn(3, 8)
    expected = model(x)
    in_ort = ortmodule.ORTModule(model)
    if not rewritten:
        with pytest.raises(Exception, match="alias_analysis"):  # noqa: PT011 - the exporter's internal assert
            in_ort(x)
        return
    loss = in_ort(x)
    loss.backward()
    assert ort_run_record(in_ort)["training"]["session"], "no ORT session"
    torch.testing.assert_close(loss, expected)


phimoe = pytest.importorskip("transformers.models.phimoe.modeling_phimoe")


class PhimoeRouter(torch.nn.Module):
    """PhiMoE's sparsemixer in small: PhimoeMultiplier gets the scores, a GatherElements of their softmax and the
    softmax (its backward returns None for both), and its output scales the hidden states by broadcasting."""

    def __init__(self) -> None:
        super().__init__()
        self.router, self.out = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.router(x)
        gates = scores.softmax(-1)
        picked = gates.argmax(-1, keepdim=True)
        mask = torch.ones_like(picked, dtype=x.dtype)
        weight = phimoe.PhimoeMultiplier.apply(scores, gates.gather(-1, picked), picked, gates, mask)
        return self.out(x * weight).square().mean()


@pytest.mark.parametrize("rewritten", [True, False])
def test_phimoe_multiplier_trains_in_ort_as_in_pytorch_only_rewritten(
    rewritten: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the rewrite ORT's GatherElements gradient misses its input (the Function's None); the rewrite's
    zeros and output shape give PyTorch's loss and gradients."""
    from ort_zero import patches

    monkeypatch.setenv("ORTMODULE_FALLBACK_POLICY", "FALLBACK_DISABLE")
    torch.manual_seed(0)
    reference, model = PhimoeRouter(), PhimoeRouter()
    model.load_state_dict(reference.state_dict())
    x = torch.randn(4, 8)
    expected = reference(x)
    expected.backward()
    in_ort = importlib.import_module("onnxruntime.training.ortmodule").ORTModule(model)
    if rewritten:
        with patches.applied(export_rewrites.PHIMOE.group):  # ORTModule exports at the first forward
            in_ort(x)
    if not rewritten:
        with pytest.raises(RuntimeError, match="GatherElements"):
            in_ort(x).backward()
        return
    loss = in_ort(x)
    loss.backward()
    assert ort_run_record(in_ort)["training"]["session"], "no ORT session"
    torch.testing.assert_close(loss, expected)
    for got, want in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-4, atol=1e-7)


blt = pytest.importorskip("transformers.models.blt.modeling_blt")


@pytest.mark.parametrize("prime", [1000000007, 5915587277, 9576890767])
def test_the_hash_with_constant_powers_gives_transformers_values(prime: int) -> None:
    tokens = torch.randint(0, 256, (2, 5, 8), generator=torch.Generator().manual_seed(0))
    for group in (2, 3, 8):  # prime**2 already passes 2**53; from prime**3 on the powers wrap around
        windows = tokens[..., :group]
        expected = blt.rolling_polynomial_hash(windows, prime)
        assert torch.equal(export_rewrites.rolling_polynomial_hash_with_constant_powers(windows, prime), expected)


class ByteGroupHashes(torch.nn.Module):
    """BLT's hash ids of byte groups (sizes 3 and 8, two primes), handed out next to a trained Linear's loss."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 1)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hashes = torch.stack(
            [blt.byte_group_hash_function(ids, g, p, 30000) for g in (3, 8) for p in (1000000007, 5915587277)], -1
        )
        return self.linear(hashes.float()).square().mean(), hashes


@pytest.mark.parametrize("rewritten", [True, False])
def test_blt_hashes_in_ort_are_torch_hashes_only_rewritten(rewritten: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from ort_zero import patches

    monkeypatch.setenv("ORTMODULE_FALLBACK_POLICY", "FALLBACK_DISABLE")
    ids = torch.randint(3, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    model = ByteGroupHashes()
    expected = model(ids)[1]
    in_ort = importlib.import_module("onnxruntime.training.ortmodule").ORTModule(model)
    with patches.applied(export_rewrites.BLT.group) if rewritten else contextlib.nullcontext():
        loss, hashes = in_ort(ids)  # ORTModule exports at the first forward
    loss.backward()
    assert ort_run_record(in_ort)["training"]["session"], "no ORT session"
    assert torch.equal(hashes, expected) == rewritten  # ORT's int64 Pow: every hash differs


cpmant = pytest.importorskip("transformers.models.cpmant.modeling_cpmant")


class MaskedLikeCpmAnt(torch.nn.Module):
    """Scores masked with CPM-Ant's attention mask, built as its model builds it (an int64 `context` of ones)."""

    prompt_length = 2

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq_len = x.shape
        ids = torch.zeros(batch, seq_len, dtype=torch.long)
        context, span = torch.ones_like(ids), torch.zeros_like(ids)
        length = torch.arange(batch) + 3
        mask = cpmant.CpmAntModel._prepare_attention_mask(self, ids, span, context, length)
        scores = self.linear(x)[:, None, :].expand(batch, seq_len, seq_len)
        return scores.masked_fill(mask == torch.tensor(False), 0.0).square().sum()


def test_cpmants_mask_from_bools_is_true_where_its_int_mask_is_nonzero() -> None:
    model, ids = MaskedLikeCpmAnt(), torch.randint(0, 9, (3, 7))
    context, span, length = torch.ones_like(ids), torch.randint(0, 2, (3, 7)), torch.tensor([2, 4, 5])
    expected = cpmant.CpmAntModel._prepare_attention_mask(model, ids, span, context, length)
    assert expected.dtype == torch.int64, "transformers' mask is no int mask: the rewrite is not needed"
    prepare = export_rewrites.mask_from_bool_context(cpmant.CpmAntModel._prepare_attention_mask)
    torch.testing.assert_close(prepare(model, ids, span, context, length), expected != 0)


@pytest.mark.parametrize("rewritten", [False, True])
def test_cpmants_mask_exports_only_from_bools(monkeypatch: pytest.MonkeyPatch, rewritten: bool) -> None:
    ortmodule = importlib.import_module("onnxruntime.training.ortmodule")
    monkeypatch.setenv("ORTMODULE_FALLBACK_POLICY", "FALLBACK_DISABLE")
    if rewritten:  # what the patch does while ORTModule exports a ZeRO-3 CPM-Ant
        prepare = export_rewrites.mask_from_bool_context(cpmant.CpmAntModel._prepare_attention_mask)
        monkeypatch.setattr(cpmant.CpmAntModel, "_prepare_attention_mask", prepare)
    torch.manual_seed(0)
    model, x = MaskedLikeCpmAnt(), torch.randn(4, 8)
    reference = MaskedLikeCpmAnt()
    reference.load_state_dict(model.state_dict())
    expected = reference(x)
    expected.backward()
    in_ort = ortmodule.ORTModule(model)
    if not rewritten:
        with pytest.raises(Exception, match="bitwise OR"):  # noqa: PT011 - the exporter's SymbolicValueError
            in_ort(x)
        return
    loss = in_ort(x)
    loss.backward()
    assert ort_run_record(in_ort)["training"]["session"], "no ORT session"
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(model.linear.weight.grad, reference.linear.weight.grad)


def _doubled(ctx: Any, x: torch.Tensor, scale: float) -> torch.Tensor:
    return x * scale * 2


def _doubled_backward_with_extra_none(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    return grad * 2, None, None


class ExtraNone(torch.autograd.Function):
    """Doubles its input; its backward returns a trailing None beyond its inputs, as Reformer's
    `_ReversibleFunction` does (PyTorch drops it)."""

    forward = staticmethod(_doubled)
    backward = staticmethod(_doubled_backward_with_extra_none)


class ExtraNoneRewritten(torch.autograd.Function):
    """The same Function under another name: ORT keeps the first backward registered under a name per process."""

    forward = staticmethod(_doubled)
    backward = staticmethod(_doubled_backward_with_extra_none)


class ThroughExtraNone(torch.nn.Module):
    def __init__(self, function: type[torch.autograd.Function]) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.function = function

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.function.apply(self.linear(x), 1.0).square().mean()


@pytest.mark.parametrize("rewritten", [False, True])
def test_a_backward_with_a_trailing_none_trains_only_with_one_gradient_per_input(
    enabled: None, monkeypatch: pytest.MonkeyPatch, rewritten: bool
) -> None:
    """ORT keeps the backward the exporter registered: exported with the rewrite, it runs the rewritten one."""
    ortmodule = importlib.import_module("onnxruntime.training.ortmodule")
    function = ExtraNoneRewritten if rewritten else ExtraNone
    if rewritten:  # what the patch does while ORTModule exports a ZeRO-3 Reformer
        backward = export_rewrites.one_gradient_per_input(vars(ExtraNone)["backward"], ExtraNone.forward)
        monkeypatch.setattr(function, "backward", backward)
    torch.manual_seed(0)
    model, reference, x = ThroughExtraNone(function), ThroughExtraNone(function), torch.randn(4, 8)
    reference.load_state_dict(model.state_dict())
    expected = reference(x)
    expected.backward()
    in_ort = ortmodule.ORTModule(model)
    loss = in_ort(x)
    if not rewritten:
        with pytest.raises(Exception, match="sizes not expected"):  # noqa: PT011 - ORT's PythonOpGrad
            loss.backward()
        return
    loss.backward()
    assert ort_run_record(in_ort)["training"]["session"], "no ORT session"
    torch.testing.assert_close(loss, expected)
    torch.testing.assert_close(model.linear.weight.grad, reference.linear.weight.grad)


def test_one_gradient_per_input_refuses_a_gradient_beyond_the_inputs() -> None:
    class Wrong(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x.clone()

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return grad, grad

    backward = export_rewrites.one_gradient_per_input(vars(Wrong)["backward"], Wrong.forward)
    with pytest.raises(RuntimeError, match="beyond its 1 inputs"):
        backward.__func__(None, torch.ones(2))
