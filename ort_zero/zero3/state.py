"""Explicit per-module ZeRO-3 state, reachable from a plain integer key.

Bridges are autograd Functions defined once, at module level; ONNX Runtime stores their non-tensor arguments in the
PythonOp, so the module travels as an integer key into this registry rather than as a Python object. The same key
lets ORT's shape-inference callbacks find a module's parameter shapes from the graph node alone.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import torch

_next_key = itertools.count(1)
_STATES: dict[int, ModuleState] = {}


@dataclass(eq=False)
class ModuleState:
    """What the bridges need to know about one module under ZeRO-3."""

    module: torch.nn.Module
    offload: Any  # deepspeed.runtime.zero.parameter_offload.DeepSpeedZeRoOffload
    key: int = field(default_factory=lambda: next(_next_key))
    # Input-gradient contributions still to come before the module's parameters can be released after backward.
    grads_remaining: int = 0
    # Post-forward bridges applied to outputs whose backward has not yet run (one gather each).
    pending_pre_backward: int = 0
    # ZeRO-3 parameters the module's forward returned (or tensors standing for them, `ds_param_alias`): DeepSpeed
    # hands them to the enclosing module as external parameters. Set by the subscriber per call; under ORT the
    # value seen at export stands for every run of the graph.
    returned_params: list[torch.nn.Parameter] = field(default_factory=list)
    # Parameters handed to ONNX Runtime as bridge outputs; frozen at first export so graph and runtime agree.
    exported_params: list[torch.nn.Parameter] | None = None

    def bridged_params(self) -> list[torch.nn.Parameter]:
        """The parameters an exported graph reads from this module's pre-forward bridge: all it gathers.

        Persistent parameters are included: DeepSpeed may release them too (`release_and_reset_all`), so ORT
        must never be fed a ZeRO-3 parameter directly.
        """
        if self.exported_params is None:
            self.exported_params = fetched_params(self.module)
        return self.exported_params


def fetched_params(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters DeepSpeed fetches for `module`: its own, its external ones, and all below a z3 leaf module."""
    from deepspeed.runtime.zero.partitioned_param_coordinator import iter_params
    from deepspeed.utils import z3_leaf_module

    unique: dict[int, torch.nn.Parameter] = {}
    for param in iter_params(module, recurse=z3_leaf_module(module)):
        unique.setdefault(id(param), param)
    return sorted(unique.values(), key=lambda p: p.ds_id)


def register(module: torch.nn.Module, offload: Any) -> ModuleState:
    state = ModuleState(module, offload)
    _STATES[state.key] = state
    return state


def unregister(state: ModuleState) -> None:
    _STATES.pop(state.key, None)


def lookup(key: int) -> ModuleState:
    try:
        return _STATES[key]
    except KeyError:
        raise RuntimeError(
            f"ort_zero: no ZeRO-3 module state for key {key}; the model was unsubscribed (disable_zero3 or engine "
            "destroyed) while an exported graph still refers to it"
        ) from None
