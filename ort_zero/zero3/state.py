"""One hooked module's ZeRO-3 state, and every change to it: when its parameters are gathered, released, gathered
again for its backward or for a recompute, and when its gradients go to DeepSpeed.

`ModuleState`'s methods are the only code that calls DeepSpeed's per-module gathers and releases; the autograd
Functions that run at step time (`bridges.py`: traced into every graph; `ort_bridges.py`: inserted into ORT's
training graph) are pass-throughs to them, as FSDP2's Functions are to its `FSDPParamGroup`.

Each forward of a module is a `ModuleCall` whose `Phase` moves strictly forward (`ModuleCall.advance` refuses any
other move): a module's calls overlap (a module used twice, a checkpoint's recompute during the backward), so the
phase belongs to the call, not to the module. A module's parameters are released after a backward once none of its
calls is still in its backward: ORT may gather a module used twice for both backwards before either ends (ProphetNet's
and Zaya's output Linear), where DeepSpeed's count, reset at every forward, would release them under the other.

Bridges are defined once, at module level, and ONNX Runtime stores their non-tensor arguments in the PythonOp, so
the module travels as an integer key into `STATES`; the same key lets ORT's shape-inference callbacks find a
module's parameter shapes from the graph node alone.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from deepspeed.runtime.zero.partition_parameters import (
    ZeroParamStatus,
    register_external_parameter,
    unregister_external_parameter,
)
from deepspeed.utils import z3_leaf_module

from ..foreign import deepspeed as ds_internals
from ..foreign import torch as torch_internals
from ..memory import heap
from ..python_op import KeyedRegistry
from . import grad_handoff
from .exported_order import ExportedOrder


class Phase(enum.Enum):
    """Where one call of a module is in the step."""

    FORWARD = "gathered for its forward"
    AFTER_FORWARD = "released after its forward"
    BACKWARD = "gathered again for its backward"
    DONE = "past its backward"
    ABANDONED = "abandoned in its forward"  # a checkpoint's recompute stopped early: nothing runs its release


MOVES: dict[str, dict[Phase, Phase]] = {
    "release_after_forward": {Phase.FORWARD: Phase.AFTER_FORWARD},
    "gather_for_backward": {Phase.AFTER_FORWARD: Phase.BACKWARD},
    # From AFTER_FORWARD when no gradient came through its outputs (they needed none, or went unused) yet one left
    # through its inputs or parameters: nothing was gathered again for it.
    "backward_done": {Phase.BACKWARD: Phase.DONE, Phase.AFTER_FORWARD: Phase.DONE},
    "abandon": {Phase.FORWARD: Phase.ABANDONED},
}


@dataclass(eq=False)
class StepClock:
    """Counts the outermost forwards of one hooked model: a call still in its forward when a later step begins was
    abandoned."""

    step: int = 0


@dataclass(eq=False)
class ModuleCall:
    """One forward of a module, from its gather to the end of its backward."""

    module: torch.nn.Module
    step: int
    phase: Phase = Phase.FORWARD

    def advance(self, move: str) -> None:
        """Take `move`, which must be one of `MOVES`'s from the current phase: anything else is an ort_zero bug."""
        after = MOVES[move].get(self.phase)
        if after is None:
            expected = " or ".join(phase.value for phase in MOVES[move])
            raise RuntimeError(
                f"ort_zero: {move} for a call of {type(self.module).__name__} (ds_id "
                f"{getattr(self.module, 'ds_id', '?')}) that is {self.phase.value}; it must be {expected}. This is an "
                "ort_zero bug: please report it with the model and the command line"
            )
        self.phase = after


@dataclass(eq=False)
class ModuleState:
    """One module under ZeRO-3: what the bridges need to know about it, and the methods that change it."""

    module: torch.nn.Module
    offload: Any  # deepspeed.runtime.zero.parameter_offload.DeepSpeedZeRoOffload
    key: int = 0  # its key in `STATES`, set by `register`
    clock: StepClock = field(default_factory=StepClock)  # shared by the states of one hooked model
    # The model's modules as its export traced them (shared too): what the first step prefetches.
    order: ExportedOrder = field(default_factory=ExportedOrder)
    # Its calls still in their forward, the innermost last (a module may run inside its own forward).
    open_calls: list[ModuleCall] = field(default_factory=list)
    # Its calls gathered again for their backward whose backward has not ended (this step's).
    backward_calls: list[ModuleCall] = field(default_factory=list)
    # ZeRO-3 parameters the module's forward returned (or tensors standing for them, `ds_param_alias`): DeepSpeed
    # hands them to the enclosing module as external parameters. Set by the subscriber per call; under ORT the
    # value seen at export stands for every run of the graph.
    returned_params: list[torch.nn.Parameter] = field(default_factory=list)
    # Parameters handed to ONNX Runtime as bridge outputs; frozen at first export so graph and runtime agree.
    exported_params: list[torch.nn.Parameter] | None = None
    # A layer (one of a stack of like modules) on the CPU: the heap gives back what it freed at its boundaries.
    trims_heap: bool = False

    def bridged_params(self) -> list[torch.nn.Parameter]:
        """The parameters an exported graph reads from this module's pre-forward bridge: all it gathers.

        Persistent parameters are included: DeepSpeed may release them too (`release_and_reset_all`), so ORT
        must never be fed a ZeRO-3 parameter directly.
        """
        if self.exported_params is None:
            self.exported_params = ds_internals.fetched_params(self.module)
        return self.exported_params

    def export_traced(self, outermost: bool) -> None:
        """The export's trace reached this module's forward (the outermost module's: the trace begins)."""
        if outermost:
            self.order.restart()
        self.order.traced(self.module)

    def start_step(self) -> None:
        """The outermost module's forward begins: DeepSpeed's coordinator starts a step (its trace, its prefetch)."""
        self.clock.step += 1
        self.offload.get_param_coordinator().reset_step()

    def gather_for_forward(self) -> ModuleCall:
        """Before its forward; returns the call the rest of its lifecycle names. A call of an earlier step still in
        its forward never ends it (a checkpoint's recompute stopped early): it is abandoned."""
        for call in [call for call in self.open_calls if call.step < self.clock.step]:
            call.advance("abandon")
            self.open_calls.remove(call)
        self.offload.pre_sub_module_forward_function(self.module)
        self.order.prefetch_from(self.module, self.offload, forward=True)
        self.open_calls.append(ModuleCall(self.module, self.clock.step))
        return self.open_calls[-1]

    def release_after_forward(self) -> ModuleCall:
        """After its forward, DeepSpeed's post-forward: leave the forward stack, hand the parameters it returned to
        the enclosing module, release the rest. Returns the call that ended its forward."""
        if not self.open_calls:
            raise RuntimeError(
                f"ort_zero: {type(self.module).__name__} ended a forward it never began. This is an ort_zero bug: "
                "please report it with the model and the command line"
            )
        call = self.open_calls.pop()
        call.advance("release_after_forward")
        ds_internals.forward_module_stack().pop()
        for param in self.returned_params:
            hand_to_enclosing_module(self.module, param)
        self.offload.post_sub_module_forward_function(self.module)
        if self.trims_heap:
            heap.give_back_if_grown()
        return call

    def gather_for_backward(self, call: ModuleCall) -> None:
        """Before the backward of `call`: its parameters gathered again. A call whose inputs needed no gradient
        never ends its backward here (`backward_done`): it is forgotten at the next step."""
        call.advance("gather_for_backward")
        self.backward_calls = [other for other in self.backward_calls if other.step == self.clock.step]
        self.backward_calls.append(call)
        if self.trims_heap:
            heap.give_back_if_grown()
        self.offload.pre_sub_module_backward_function(self.module)
        self.order.prefetch_from(self.module, self.offload, forward=False)

    def params_for_backward(self, ds_ids: Sequence[int]) -> tuple[torch.Tensor, ...]:
        """Under ORT, the parameters its backward reads, as gathered again for it (`gather_for_backward`)."""
        by_id = {p.ds_id: p for p in ds_internals.fetched_params(self.module)}
        params = [by_id.get(ds_id) for ds_id in ds_ids]
        missing = [ds_id for ds_id, p in zip(ds_ids, params, strict=True) if p is None or not _available(p)]
        if missing:
            raise RuntimeError(
                f"ort_zero: the backward of {type(self.module).__name__} (ds_id {self.module.ds_id}) needs "
                f"parameters {missing}, which DeepSpeed has not gathered for it"
            )
        return tuple(p.detach() for p in params)

    def params_for_recompute(self, ds_ids: Sequence[int]) -> tuple[torch.Tensor, ...]:
        """Under ORT, before its recomputed forward ops: its parameters gathered for them. The full tensors go to
        ORT, which frees them after the recomputed ops; DeepSpeed's own state is left as found (what was partitioned
        is partitioned again at once), as a checkpointed module's recompute gathers and releases natively."""
        by_id = {p.ds_id: p for p in ds_internals.fetched_params(self.module)}
        params = [by_id[ds_id] for ds_id in ds_ids]
        ds_internals.wait_for_inflight_gathers(self.offload, params)
        partitioned = [p for p in params if p.ds_status == ZeroParamStatus.NOT_AVAILABLE]
        if partitioned:
            partitioned[0].all_gather(param_list=partitioned)
        full = tuple(p.detach() for p in params)  # ORT's references keep the gathered storage alive
        if partitioned:
            partitioned[0].partition(param_list=partitioned, has_been_updated=False)
        return full

    def gradients_arrived(self, grads: Sequence[torch.Tensor | None]) -> None:
        """Its backward computed its parameters' gradients (ORT's): each goes to DeepSpeed while still gathered."""
        for param, grad in zip(self.bridged_params(), grads, strict=False):
            if grad is not None and param.requires_grad:
                grad_handoff.hand_over(param, grad)
        if z3_leaf_module(self.module):
            # DeepSpeed reduces a z3 leaf module's gradients in a full backward hook on the module, which cannot
            # fire when the module's backward runs inside ORT: run it now that its parameters have gradients.
            for hook in torch_internals.full_backward_hooks(self.module):
                hook(self.module, (), ())

    def backward_done(self, call: ModuleCall) -> None:
        """The backward of `call` through its inputs ended; once no other call is in its backward, DeepSpeed's
        post-backward releases the parameters."""
        call.advance("backward_done")
        self.backward_calls = [other for other in self.backward_calls if other is not call]
        if not any(other.step == self.clock.step for other in self.backward_calls):
            self.backward_calls.clear()
            self.offload.post_sub_module_backward_function(self.module)


STATES: KeyedRegistry[ModuleState] = KeyedRegistry("ZeRO-3 module state")
"""Every hooked module's state, held by its subscriber (`ZeROOffloadSubscriber.states`) until it closes."""


def register(
    module: torch.nn.Module,
    offload: Any,
    trims_heap: bool = False,
    clock: StepClock | None = None,
    order: ExportedOrder | None = None,
) -> ModuleState:
    state = ModuleState(
        module, offload, clock=clock or StepClock(), order=order or ExportedOrder(), trims_heap=trims_heap
    )
    state.key = STATES.add(state)
    return state


def unregister(state: ModuleState) -> None:
    STATES.remove(state.key)


def lookup(key: int) -> ModuleState:
    return STATES[key]


def hand_to_enclosing_module(module: torch.nn.Module, param: torch.nn.Parameter) -> None:
    """A parameter `module` returned is used after `module` ends, as DeepSpeed handles it: unless a module still
    running has it already, it becomes an external parameter of the innermost one (leaving `module`'s, which the
    enclosing module now covers) and stays gathered; external parameters are never released after a module."""
    running = ds_internals.forward_module_stack()
    if any(ds_internals.has_external_param(m, param) for m in running):
        return
    param.is_external_param = True
    register_external_parameter(running[-1], param)
    if ds_internals.has_external_param(module, param):
        unregister_external_parameter(module, param)
    param.all_gather()


def _available(param: torch.nn.Parameter) -> bool:
    return param.ds_status == ZeroParamStatus.AVAILABLE
