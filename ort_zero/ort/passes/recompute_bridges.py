"""The bridges only a recomputed ORT graph has: where the backward enters a recomputed region, and each recomputed
module's parameters gathered again (the recompute pass, `recompute.py`, inserts them)."""

from __future__ import annotations

from typing import Any

import torch

from ...foreign import deepspeed as ds_internals
from ...zero3 import state as zero3_state


class RecomputeStartBridge(torch.autograd.Function):
    """Under ORT, where the backward enters a recomputed region: the region's inputs, passed on.

    `key` is the region module's; `after` is an output of the region's PostForwardBridge gradient node, only so that
    the recomputation (which reads the outputs) runs in the backward, when the region's backward starts, not
    in the forward.
    """

    @staticmethod
    def forward(ctx: Any, key: int, after: torch.Tensor, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # Copies, not views: a layer's inputs may share memory (e.g. rotary cos/sin), which ORT's alias maps reject.
        return tuple(t.clone() for t in tensors)


class RecomputeParamsBridge(torch.autograd.Function):
    """Under ORT, before a module's recomputed forward ops: its parameters gathered again for them.

    Its tensor input is the module's first recomputed input, so that the gather happens when the recomputation
    reaches the module. The full parameters go to ORT, which frees them after the recomputed ops; DeepSpeed's own
    state is left as found (what was partitioned is partitioned again at once), as a checkpointed module's
    recompute forward gathers and releases in native ZeRO-3.
    """

    @staticmethod
    def forward(ctx: Any, key: int, after: torch.Tensor, *ds_ids: int) -> tuple[torch.Tensor, ...]:
        from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

        module_state = zero3_state.lookup(key)
        by_id = {p.ds_id: p for p in zero3_state.fetched_params(module_state.module)}
        params = [by_id[ds_id] for ds_id in ds_ids]
        ds_internals.wait_for_inflight_gathers(module_state.offload, params)
        partitioned = [p for p in params if p.ds_status == ZeroParamStatus.NOT_AVAILABLE]
        if partitioned:
            partitioned[0].all_gather(param_list=partitioned)
        full = tuple(p.detach() for p in params)  # ORT's references keep the gathered storage alive
        if partitioned:
            partitioned[0].partition(param_list=partitioned, has_been_updated=False)
        return full
