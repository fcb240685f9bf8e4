"""The causal-LM sweep's worker: its verdict per type (what counts as training in ORT, and what is native's failure,
not ORT's), and the batches it gives each type: shaped as the model's forward takes them."""

from __future__ import annotations

import argparse
import math
from typing import Any

import pytest
import torch

from ort_zero.examples.hf_models import causal_lm_from_config, model_config
from ort_zero.tools import causal_lm_worker

RAN_IN_ORT = {
    "session": True,
    "python_ops": ["ort_zero.zero3.bridges.PreForwardBridge"],
    "attn_implementation": "eager",
}


def _runs(native: list[float], ort: list[float]) -> Any:
    def train(
        model_type: str, attn: str, steps: int, in_ort: bool, precision: str
    ) -> tuple[list[float], dict[str, Any]]:
        return (ort, RAN_IN_ORT) if in_ort else (native, {"attn_implementation": "eager"})

    return train


@pytest.mark.parametrize(
    ("native", "ort", "precision", "status"),
    [
        ([5.5, 5.4], [5.5, 5.4 + 5e-6], "fp32", "trains"),
        ([5.5, 5.4], [5.5, 5.4 + 5e-5], "fp32", "losses differ"),
        ([5.5, 5.375], [5.5, 5.40625], "bf16", "trains"),  # one bf16 ulp at 5.4
        ([5.5, 5.375], [5.5, 5.5], "bf16", "losses differ"),  # four
        ([math.nan, math.nan], [math.nan, math.nan], "fp32", "native fails"),  # NaN natively: nothing to agree with
        ([5.5, math.inf], [5.5, 5.4], "fp32", "native fails"),
    ],
)
def test_status(
    monkeypatch: pytest.MonkeyPatch, native: list[float], ort: list[float], precision: str, status: str
) -> None:
    monkeypatch.setattr(causal_lm_worker, "train", _runs(native, ort))
    result = causal_lm_worker.sweep_one("gpt2", "default", len(native), precision)
    assert result["status"] == status
    if status == "native fails":
        assert "losses" in result["error"] and "ort" not in result


def test_not_in_ort_when_no_bridge_ran(monkeypatch: pytest.MonkeyPatch) -> None:
    def train(
        model_type: str, attn: str, steps: int, in_ort: bool, precision: str
    ) -> tuple[list[float], dict[str, Any]]:
        return [5.5], ({"session": False, "python_ops": []} if in_ort else {"attn_implementation": "sdpa"})

    monkeypatch.setattr(causal_lm_worker, "train", train)
    assert causal_lm_worker.sweep_one("gpt2", "default", 1, "fp32")["status"] == "not in ORT"


def test_text_batches_are_sequences_labelled_by_themselves() -> None:
    (batch,) = causal_lm_worker.batches(1, seq_len=8)
    assert batch["input_ids"].shape == batch["attention_mask"].shape == batch["labels"].shape == (2, 8)
    assert torch.equal(batch["labels"], batch["input_ids"])


def test_codebook_batches_are_shaped_as_the_model_takes_them() -> None:
    """A model over parallel codebooks (MusicGen's decoder) takes input_ids (batch * codebooks, seq) and labels
    (batch, seq, codebooks): the label of sequence b, position t, codebook k is row b * codebooks + k's token t."""
    (batch,) = causal_lm_worker.batches(1, seq_len=8, codebooks=4)
    ids, labels = batch["input_ids"], batch["labels"]
    assert ids.shape == (8, 8) and labels.shape == (2, 8, 4) and batch["attention_mask"].shape == (2, 8)
    for b, t, k in ((0, 0, 0), (1, 5, 3), (1, 7, 2)):
        assert labels[b, t, k] == ids[b * 4 + k, t]


@pytest.mark.parametrize("model_type", ["musicgen", "musicgen_melody"])
def test_the_sweep_builds_musicgen_from_its_decoder_config_and_it_trains_a_step(model_type: str) -> None:
    """`AutoModelForCausalLM.from_config` hands MusicGen's causal LM the whole config (it reads the decoder's): built
    from the decoder part, small, it takes the sweep's codebook batches and gives a finite loss."""
    sizes = argparse.Namespace(model_type=model_type, hidden_size=32, layers=2, heads=4, seq_len=32)
    torch.manual_seed(0)
    model = causal_lm_from_config(model_config(sizes))
    assert sum(p.numel() for p in model.parameters()) < 200_000
    (batch,) = causal_lm_worker.batches(1, codebooks=model.config.num_codebooks)
    loss = model(**batch).loss
    loss.backward()
    assert math.isfinite(loss.item())


@pytest.mark.parametrize(("model_type", "codebooks"), [("musicgen", 4), ("musicgen_melody", 4), ("moshi", None)])
def test_only_a_decoder_built_from_part_of_a_config_takes_codebook_batches(
    model_type: str, codebooks: int | None
) -> None:
    """MusicGen's causal LM is built from its decoder config and takes codebooks; Moshi's config names codebooks
    too (its audio depth decoder), but its causal LM is built from the whole config and reads text (codebook
    batches made its ORT export fail)."""
    from ort_zero.examples.hf_models import causal_lm_from_config, model_config

    built_from = model_config(argparse.Namespace(model_type=model_type, hidden_size=32, layers=2, heads=4, seq_len=32))
    assert getattr(built_from, "num_codebooks", None) or getattr(built_from.decoder, "num_codebooks", None)
    assert causal_lm_worker.codebooks_of(built_from, causal_lm_from_config(built_from).config) == codebooks


def test_a_bf16_sweep_turns_deepspeeds_bf16_on() -> None:
    assert causal_lm_worker.ds_config("bf16")["bf16"] == {"enabled": True}
    assert "bf16" not in causal_lm_worker.ds_config("fp32")
