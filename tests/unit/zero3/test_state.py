"""The registry of per-module states behind the bridges' integer keys, and what a state hands ORT."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from ort_zero.foreign import deepspeed as ds_internals
from ort_zero.zero3 import state as zero3_state
from ort_zero.zero3.bridges import StepStartBridge


def test_registry_hands_out_keys_and_releases_them() -> None:
    """Keys are unique per registration; a released key fails with a message that says what happened."""
    module = nn.Linear(2, 2)
    first, second = zero3_state.register(module, "offload"), zero3_state.register(module, "offload")
    try:
        assert first.key != second.key
        assert zero3_state.lookup(first.key) is first and zero3_state.lookup(second.key) is second
        zero3_state.unregister(first)
        with pytest.raises(RuntimeError, match=f"no ZeRO-3 module state for key {first.key}.*unsubscribed"):
            zero3_state.lookup(first.key)
        zero3_state.unregister(first)  # a second release is harmless
        assert zero3_state.lookup(second.key) is second
    finally:
        zero3_state.unregister(second)
    with pytest.raises(RuntimeError, match="unsubscribed"):
        StepStartBridge.apply(second.key, torch.randn(2))


def test_bridged_params_are_fetched_in_ds_id_order_and_frozen(deepspeed_init: Callable) -> None:
    """What a bridge hands ORT is fixed at first use, so the exported graph and later runs agree."""
    from deepspeed.runtime.zero.partition_parameters import register_external_parameter

    owner, other = nn.Linear(2, 2), nn.Linear(2, 2)
    root = nn.ModuleList([other, owner])
    deepspeed_init(root)  # other's parameters get the lower ds_ids
    register_external_parameter(owner, other.weight)
    module_state = zero3_state.register(owner, "offload")
    try:
        expected = [other.weight, owner.weight, owner.bias]
        assert module_state.bridged_params() == expected
        owner.extra = nn.Parameter(torch.zeros(1))
        owner.extra.ds_id = -1
        assert module_state.bridged_params() == expected
        assert ds_internals.fetched_params(owner)[0] is owner.extra
    finally:
        zero3_state.unregister(module_state)
