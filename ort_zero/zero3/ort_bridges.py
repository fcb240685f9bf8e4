"""The bridges only ORT's training graph has, inserted by ort_zero's passes (`ort_zero.ort.passes.backward_gather`,
`recompute`), never traced: pass-throughs to the module's `ModuleState`, like the traced bridges (`bridges.py`).

    BackwardParamsBridge   before a module's backward: its parameters as gathered again for it
    RecomputeStartBridge   where the backward enters a recomputed region: the region's inputs, copied
    RecomputeParamsBridge  before a module's recomputed forward ops: its parameters gathered for them
"""

from __future__ import annotations

from typing import Any

import torch

from ..python_op import records_errors
from . import state as zero3_state


@records_errors
class BackwardParamsBridge(torch.autograd.Function):
    """Its tensor input is one of the module's PostForwardBridge gradient outputs, only so that it runs after that
    gather. The module's backward reads these outputs instead of the forward's copies, which ORT can then free right
    after the forward, as native ZeRO-3 does."""

    SCALARS = ("key",)  # then one ds_id per parameter (`bridge_nodes`)

    @staticmethod
    def forward(ctx: Any, key: int, after_gather: torch.Tensor, *ds_ids: int) -> tuple[torch.Tensor, ...]:
        return zero3_state.lookup(key).params_for_backward(ds_ids)


@records_errors
class RecomputeStartBridge(torch.autograd.Function):
    """`key` is the region module's; `after` is an output of the region's PostForwardBridge gradient node, only so that
    the recomputation (which reads the outputs) runs in the backward, when the region's backward starts, not in the
    forward."""

    SCALARS = ("key",)

    @staticmethod
    def forward(ctx: Any, key: int, after: torch.Tensor, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # Copies, not views: a layer's inputs may share memory (e.g. rotary cos/sin), which ORT's alias maps reject.
        return tuple(t.clone() for t in tensors)


@records_errors
class RecomputeParamsBridge(torch.autograd.Function):
    """Its tensor input is the module's first recomputed input, so that the gather happens when the recomputation
    reaches the module."""

    SCALARS = ("key",)  # then one ds_id per parameter

    @staticmethod
    def forward(ctx: Any, key: int, after: torch.Tensor, *ds_ids: int) -> tuple[torch.Tensor, ...]:
        return zero3_state.lookup(key).params_for_recompute(ds_ids)
