"""ort_zero.python_op.KeyedRegistry: what a PythonOp finds by its integer key, under one lifetime rule."""

from __future__ import annotations

import gc

import pytest
import torch

from ort_zero.python_op import KeyedRegistry


def test_an_entry_lives_while_something_holds_it_and_until_removed() -> None:
    registry: KeyedRegistry[torch.nn.Parameter] = KeyedRegistry("parameter")
    kept, dropped = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.zeros(2))
    kept_key, dropped_key = registry.add(kept), registry.add(dropped)
    assert kept_key != dropped_key and registry[kept_key] is kept
    del dropped
    gc.collect()
    with pytest.raises(RuntimeError, match=f"no parameter for key {dropped_key}: it was unsubscribed or collected"):
        registry[dropped_key]
    registry.remove(kept_key)
    registry.remove(kept_key)  # a second removal is harmless
    with pytest.raises(RuntimeError, match=f"no parameter for key {kept_key}"):
        registry[kept_key]


def test_an_entry_may_bring_its_own_key() -> None:
    registry: KeyedRegistry[torch.nn.Parameter] = KeyedRegistry("parameter")
    param = torch.nn.Parameter(torch.ones(1))
    assert registry.add(param, key=id(param)) == id(param)
    assert registry[id(param)] is param
