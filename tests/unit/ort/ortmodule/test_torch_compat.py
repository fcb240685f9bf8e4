"""ort_zero.ort.ortmodule.torch_compat: ORT's exports run on torch's TorchScript exporter without saying, export after
export, that the route is deprecated or what the tracer guesses of the model's Python control flow; other warnings
stay."""

from __future__ import annotations

import importlib
import warnings

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from ort_zero.ort.inspection import ort_run_record


@pytest.mark.usefixtures("enabled")
def test_an_export_says_no_deprecation_and_no_tracer_guess() -> None:
    ortmodule = importlib.import_module("onnxruntime.training.ortmodule")
    config = LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=32,
    )  # fmt: skip
    model = ortmodule.ORTModule(LlamaForCausalLM(config))
    ids = torch.randint(0, 64, (2, 8))
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        model(input_ids=ids, labels=ids).loss.backward()
    assert ort_run_record(model)["training"]["session"], "no ORT session: nothing was exported"
    quieted = [w for w in said if issubclass(w.category, (DeprecationWarning, torch.jit.TracerWarning))]
    assert quieted == [], [f"{w.category.__name__}: {w.message}" for w in quieted]
    assert any(issubclass(w.category, UserWarning) for w in said), "the exporter's other warnings must stay"


def test_other_callers_of_torch_onnx_export_are_left_alone() -> None:
    """Outside ONNX Runtime's modules the export is torch's own: its arguments and its warnings."""
    from ort_zero.ort.ortmodule.torch_compat import torchscript_export_for_ort

    def export(*args: object, **kwargs: object) -> dict:
        warnings.warn("You are using the legacy TorchScript-based ONNX export", DeprecationWarning, stacklevel=2)
        return kwargs

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        assert torchscript_export_for_ort(export)() == {}
    assert [w.category for w in said] == [DeprecationWarning]
