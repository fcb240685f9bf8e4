"""ort_zero.ort.ortmodule.output_structures: model outputs ORTModule's own walk cannot take apart (transformers' caches)
pass through ORTModule, rebuilt after every ORT run; what no walk can take apart is one line naming the type."""

from __future__ import annotations

import importlib
from typing import Any

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.cache_utils import DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

from ort_zero.ort.inspection import ort_run_record
from ort_zero.ort.ortmodule import output_structures
from ort_zero.ort.ortmodule.output_structures import OutputTemplate, UnflattenableOutput, take_apart


def plain_attributes(layer: object) -> dict[str, object]:
    return {name: value for name, value in vars(layer).items() if not isinstance(value, torch.Tensor)}


def filled_cache(layers: int = 2) -> DynamicCache:
    cache = DynamicCache()
    for layer in range(layers):
        cache.update(torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4), layer)
    return cache


class Slotted:
    """Holds a tensor but has no attributes dictionary: neither walk can take it apart."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


class Ring:
    """An object of plain attributes that refers back to itself."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor
        self.me = self
        self.device = tensor.device


def test_a_cache_in_a_model_output_comes_back_with_new_tensors() -> None:
    cache = filled_cache()
    output = CausalLMOutputWithPast(loss=torch.tensor(1.0), logits=torch.randn(1, 3, 5), past_key_values=cache)
    tensors, template = take_apart(output)
    assert len(tensors) == 2 + 2 * 2, "loss, logits, and each layer's keys and values"
    assert any(t is cache.layers[1].values for t in tensors)

    rebuilt = template.rebuild([t * 2 for t in tensors])
    assert type(rebuilt) is CausalLMOutputWithPast
    assert torch.equal(rebuilt.logits, output.logits * 2)
    new_cache = rebuilt.past_key_values
    assert type(new_cache) is DynamicCache and new_cache is not cache
    for new, old in zip(new_cache.layers, cache.layers, strict=True):
        assert type(new) is type(old) and new is not old
        assert torch.equal(new.keys, old.keys * 2) and torch.equal(new.values, old.values * 2)
        assert new.is_initialized and plain_attributes(new) == plain_attributes(old)  # 5.24 keeps no dtype
    assert new_cache.get_seq_length() == cache.get_seq_length() == 3
    assert "6 tensors" in repr(template)


def test_objects_without_tensors_and_references_back_are_kept_as_they_are() -> None:
    ring = Ring(torch.ones(2))
    note = Ring.__new__(Ring)  # an object of plain attributes holding no tensor: kept, not copied
    tensors, template = take_apart({"ring": ring, "note": note})
    assert len(tensors) == 1
    rebuilt = template.rebuild([torch.zeros(2)])
    assert rebuilt["note"] is note
    assert torch.equal(rebuilt["ring"].tensor, torch.zeros(2)) and rebuilt["ring"].me is ring


def test_what_no_walk_takes_apart_is_one_line_naming_the_type() -> None:
    with pytest.raises(UnflattenableOutput) as caught:
        take_apart((torch.ones(1), Slotted(torch.ones(1))))
    message = str(caught.value)
    assert "\n" not in message
    assert f"{__name__}.Slotted" in message and "register_pytree_node" in message


def test_ort_schemas_stay_ort_and_its_other_errors_stay_its_own() -> None:
    def ort_extract(data: Any, device: Any) -> Any:
        if data == "bad":
            raise TypeError("ORTModule fails to extract schema from data: something else")
        return ["ort's tensors"], "ort's schema"

    extract = output_structures.extracting_any_structure(ort_extract)
    assert extract("fine", None) == (["ort's tensors"], "ort's schema")
    with pytest.raises(TypeError, match="something else"):
        extract("bad", None)
    unflatten = output_structures.rebuilding_any_structure(lambda data, schema: ("ort", schema))
    assert unflatten([], "ort's schema") == ("ort", "ort's schema")
    assert isinstance(take_apart(filled_cache())[1], OutputTemplate)


@pytest.mark.usefixtures("enabled")
def test_a_llama_at_its_defaults_trains_in_ort_and_returns_its_cache() -> None:
    """use_cache=True, as `from_config` gives it: ORT's loss and gradients are PyTorch's, and the cache ORTModule
    returns holds the keys and values of this step, as PyTorch's does."""
    ortmodule = importlib.import_module("onnxruntime.training.ortmodule")
    config = LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=32,
    )  # fmt: skip
    assert config.use_cache
    torch.manual_seed(0)
    reference, model = LlamaForCausalLM(config), LlamaForCausalLM(config)
    model.load_state_dict(reference.state_dict())
    in_ort = ortmodule.ORTModule(model)
    ids = torch.randint(0, 64, (2, 8))
    for _ in range(2):  # the second step runs from the template the export made
        expected, got = reference(input_ids=ids, labels=ids), in_ort(input_ids=ids, labels=ids)
        expected.loss.backward()
        got.loss.backward()
        torch.testing.assert_close(got.loss, expected.loss, rtol=1e-5, atol=1e-6)
        assert type(got.past_key_values) is DynamicCache
        for ours, theirs in zip(got.past_key_values.layers, expected.past_key_values.layers, strict=True):
            torch.testing.assert_close(ours.keys, theirs.keys, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(ours.values, theirs.values, rtol=1e-5, atol=1e-6)
    for ours, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-4, atol=1e-6)
    assert ort_run_record(in_ort)["training"]["session"], "no ORT session: the model did not run in ORT"


@pytest.mark.usefixtures("enabled")
def test_an_output_no_walk_takes_apart_stops_the_export_in_one_line() -> None:
    ortmodule = importlib.import_module("onnxruntime.training.ortmodule")

    class ReturnsSlotted(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, Slotted]:
            y = self.linear(x)
            return y.sum(), Slotted(y)

    with pytest.raises(Exception, match=r"cannot return a .*Slotted among") as caught:
        ortmodule.ORTModule(ReturnsSlotted())(torch.ones(2, 4))
    assert "\n" not in str(caught.value).strip()
