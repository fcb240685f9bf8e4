"""ort_zero.hooks.nested: flatten/rebuild round trips over everything a module may take or return."""

from __future__ import annotations

import dataclasses
from collections import namedtuple
from typing import Any

import pytest
import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

from ort_zero.hooks import flatten, map_tensors


def t(*values: float) -> torch.Tensor:
    return torch.tensor(values)


def assert_same(a: Any, b: Any) -> None:
    """Equal structure, types and leaves (tensors compared by value)."""
    assert type(a) is type(b), f"{type(a)} != {type(b)}"
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif dataclasses.is_dataclass(a):
        for field in dataclasses.fields(a):
            assert_same(getattr(a, field.name), getattr(b, field.name))
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    else:
        assert a == b


def round_trip(structure: Any, expected_tensors: int) -> None:
    """Flatten, check the tensors are the originals in order, rebuild with new tensors and with the same ones."""
    flat = flatten(structure)
    assert len(flat.tensors) == expected_tensors
    assert_same(flat.rebuild(flat.tensors), structure)
    doubled = flat.rebuild([x * 2 for x in flat.tensors])
    assert_same(doubled, map_tensors(lambda x: x * 2, structure))
    for new, old in zip(flatten(doubled).tensors, flat.tensors, strict=True):
        assert torch.equal(new, old * 2)


@dataclasses.dataclass
class Inner:
    hidden: torch.Tensor
    note: str = "inner"


@dataclasses.dataclass
class Outer:
    inner: Inner
    extra: list[torch.Tensor]
    count: int = 0


@pytest.mark.parametrize(
    ("structure", "tensors"),
    [
        (t(1.0), 1),
        ((t(1.0), t(2.0, 3.0)), 2),
        ([t(1.0), [t(2.0), (t(3.0),)]], 3),
        ({"b": t(1.0), "a": {"c": t(2.0)}}, 2),
        ((t(1.0), None, 3, "s", 2.5, {"mask": None, "x": t(4.0)}), 2),
        (((t(1.0),), {"scale": 2, "bias": t(0.5)}), 2),  # (args, kwargs) as the manager flattens them
        ((None, 1), 0),
        (Outer(Inner(t(1.0)), [t(2.0), t(3.0)], count=7), 3),
        (namedtuple("Pair", "first second")(t(1.0), None), 1),
    ],
    ids=["tensor", "tuple", "nested-list", "dict", "none-and-scalars", "args-kwargs", "no-tensors", "dataclass", "nt"],
)
def test_round_trip(structure: Any, tensors: int) -> None:
    round_trip(structure, tensors)


def test_tensors_come_out_in_order_and_unchanged() -> None:
    a, b, c = t(1.0), t(2.0), t(3.0)
    flat = flatten({"x": (a, None), "y": [b, {"z": c}]})
    assert [id(x) for x in flat.tensors] == [id(a), id(b), id(c)]


def test_a_user_dataclass_never_seen_before() -> None:
    """Defined here, so pytree cannot know it; also frozen and with a field computed in __post_init__."""

    @dataclasses.dataclass(frozen=True)
    class Fresh:
        logits: torch.Tensor
        nested: Inner | None
        label: str = "fresh"
        size: int = dataclasses.field(init=False, default=0)

        def __post_init__(self) -> None:
            object.__setattr__(self, "size", self.logits.numel())

    structure = (Fresh(t(1.0, 2.0), Inner(t(3.0))), Fresh(t(4.0), None, label="second"))
    round_trip(structure, 3)
    rebuilt = flatten(structure).rebuild([t(9.0, 9.0, 9.0), t(8.0), t(7.0)])
    assert rebuilt[0].size == 3 and rebuilt[1].label == "second" and rebuilt[1].nested is None


def test_hugging_face_causal_lm_output() -> None:
    layers = tuple((torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4)) for _ in range(2))
    output = CausalLMOutputWithPast(loss=t(0.5), logits=torch.randn(1, 3, 10), past_key_values=layers)
    flat = flatten(output)
    assert len(flat.tensors) == 6
    assert flat.tensors[0] is output.loss and flat.tensors[1] is output.logits
    rebuilt = flat.rebuild([x + 1 for x in flat.tensors])
    assert isinstance(rebuilt, CausalLMOutputWithPast)
    assert torch.equal(rebuilt.logits, output.logits + 1) and torch.equal(rebuilt["loss"], output.loss + 1)
    assert torch.equal(rebuilt.past_key_values[1][0], layers[1][0] + 1)
    assert rebuilt.hidden_states is None and list(rebuilt.keys()) == list(output.keys())


def test_hugging_face_output_without_loss_keeps_none() -> None:
    output = CausalLMOutputWithPast(logits=torch.randn(1, 3, 10))
    rebuilt = map_tensors(lambda x: x * 0, output)
    assert rebuilt.loss is None and rebuilt.past_key_values is None
    assert torch.equal(rebuilt.logits, torch.zeros(1, 3, 10)) and rebuilt[0].shape == (1, 3, 10)


def test_rebuild_rejects_the_wrong_number_of_tensors() -> None:
    flat = flatten((t(1.0), t(2.0)))
    with pytest.raises(ValueError, match="expected 2 tensors"):
        flat.rebuild([t(1.0)])


def test_rebuild_keeps_autograd_history() -> None:
    weight = torch.ones(2, requires_grad=True)
    flat = flatten({"x": weight * 3, "n": None})
    rebuilt = flat.rebuild([x * 2 for x in flat.tensors])
    rebuilt["x"].sum().backward()
    assert torch.equal(weight.grad, torch.full((2,), 6.0))
