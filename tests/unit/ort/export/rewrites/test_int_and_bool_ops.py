"""Bools and int64s while ort_zero exports: a scattered Python bool traced as an int (torch's exporter asserts on
the bool), CPM-Ant's int mask built from bools (no opset ORT trains exports its bitwise or), BLT's hash with its prime
powers computed at export (ORT's int64 Pow computes in floating point)."""

from __future__ import annotations

import contextlib
import importlib

import pytest
import torch

import ort_zero  # noqa: F401  (before ORT: makes ORTModule importable on today's torch)
from ort_zero.ort.export import rewrites as export_rewrites
from ort_zero.ort.export.rewrites import int_and_bool_ops
from ort_zero.ort.inspection import ort_run_record


def _trained_in_ort_or_refused(in_ort: torch.nn.Module, x: torch.Tensor, refused: str) -> torch.Tensor | None:
    """A step of `in_ort` in ORT (an ORT session ran), or, with `refused`, the export's error matching it."""
    if refused:
        with pytest.raises(Exception, match=refused):  # noqa: PT011 - the exporter's own errors
            in_ort(x)
        return None
    loss = in_ort(x)
    loss.backward()
    assert ort_run_record(in_ort)["training"]["session"], "no ORT session"
    return loss


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
    scatter = int_and_bool_ops.scatter_bool_value_as_int(torch.Tensor.scatter)
    scatter_ = int_and_bool_ops.scatter_bool_value_as_int(torch.Tensor.scatter_)
    torch.testing.assert_close(scatter(mask, -1, index, False), mask.scatter(-1, index, False))
    torch.testing.assert_close(scatter(mask, -1, index, value=False), mask.scatter(-1, index, False))
    torch.testing.assert_close(scatter_(mask.clone(), 1, index, False), mask.scatter(1, index, False))


@pytest.mark.parametrize("rewritten", [False, True])
def test_a_scattered_bool_exports_only_as_an_int(monkeypatch: pytest.MonkeyPatch, rewritten: bool) -> None:
    ortmodule = importlib.import_module("onnxruntime.training.ortmodule")
    monkeypatch.setenv("ORTMODULE_FALLBACK_POLICY", "FALLBACK_DISABLE")
    if rewritten:  # what the patch does while ORTModule exports a ZeRO-3 model
        monkeypatch.setattr(torch.Tensor, "scatter", int_and_bool_ops.scatter_bool_value_as_int(torch.Tensor.scatter))
    torch.manual_seed(0)
    model, x = MaskedByTopK(), torch.randn(3, 8)
    expected = model(x)
    loss = _trained_in_ort_or_refused(ortmodule.ORTModule(model), x, refused="" if rewritten else "alias_analysis")
    if rewritten:
        torch.testing.assert_close(loss, expected)


blt = pytest.importorskip("transformers.models.blt.modeling_blt")


@pytest.mark.parametrize("prime", [1000000007, 5915587277, 9576890767])
def test_the_hash_with_constant_powers_gives_transformers_values(prime: int) -> None:
    tokens = torch.randint(0, 256, (2, 5, 8), generator=torch.Generator().manual_seed(0))
    for group in (2, 3, 8):  # prime**2 already passes 2**53; from prime**3 on the powers wrap around
        windows = tokens[..., :group]
        expected = blt.rolling_polynomial_hash(windows, prime)
        assert torch.equal(int_and_bool_ops.rolling_polynomial_hash_with_constant_powers(windows, prime), expected)


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
    prepare = int_and_bool_ops.mask_from_bool_context(cpmant.CpmAntModel._prepare_attention_mask)
    torch.testing.assert_close(prepare(model, ids, span, context, length), expected != 0)


@pytest.mark.parametrize("rewritten", [False, True])
def test_cpmants_mask_exports_only_from_bools(monkeypatch: pytest.MonkeyPatch, rewritten: bool) -> None:
    ortmodule = importlib.import_module("onnxruntime.training.ortmodule")
    monkeypatch.setenv("ORTMODULE_FALLBACK_POLICY", "FALLBACK_DISABLE")
    if rewritten:  # what the patch does while ORTModule exports a ZeRO-3 CPM-Ant
        prepare = int_and_bool_ops.mask_from_bool_context(cpmant.CpmAntModel._prepare_attention_mask)
        monkeypatch.setattr(cpmant.CpmAntModel, "_prepare_attention_mask", prepare)
    torch.manual_seed(0)
    model, x = MaskedLikeCpmAnt(), torch.randn(4, 8)
    reference = MaskedLikeCpmAnt()
    reference.load_state_dict(model.state_dict())
    expected = reference(x)
    expected.backward()
    loss = _trained_in_ort_or_refused(ortmodule.ORTModule(model), x, refused="" if rewritten else "bitwise OR")
    if rewritten:
        torch.testing.assert_close(loss, expected)
        torch.testing.assert_close(model.linear.weight.grad, reference.linear.weight.grad)
