"""DeepSpeed's ZeRO-3 engine: its per-module hooks, gloo's reduce-scatter and the order of a checkpoint's files."""

from __future__ import annotations

from ..patch_groups import ZERO3
from .declare import deepspeed_patch, deferred, ort_zero_module

deepspeed_patch(
    ZERO3, "deepspeed.setup_zero_stage3_hooks", "deepspeed.runtime.zero.parameter_offload:DeepSpeedZeRoOffload",
    "setup_zero_stage3_hooks",
    "ZeRO-3's gathers and releases must run through autograd-Function bridges (PythonOps under ORT) instead of "
    "DeepSpeed's per-module closures, which ORT cannot tell apart and which run collectives while tracing.",
    lambda replaced: ort_zero_module("zero3.install").setup_zero_stage3_hooks,
)  # fmt: skip


deepspeed_patch(
    ZERO3, "deepspeed.reduce_scatter_in_place_on_gloo", "deepspeed.runtime.comm.coalesced_collectives",
    "_torch_reduce_scatter_fn",
    "on gloo torch's reduce-scatter works on a fresh buffer the size of its whole input, every call; DeepSpeed's "
    "gradient reduce-scatter gives it scratch whose own chunk is the output, so an all-reduce in place gives the "
    "same values without that buffer (zero3/gloo_reduce_scatter.py).",
    deferred(lambda: ort_zero_module("zero3.gloo_reduce_scatter").in_place_on_gloo),
)  # fmt: skip


deepspeed_patch(
    ZERO3, "deepspeed.save_checkpoint_latest_last", "deepspeed.runtime.engine:DeepSpeedEngine", "save_checkpoint",
    "DeepSpeed's rank 0 writes the `latest` tag before the other ranks have finished writing their shards: a rank "
    "lost mid-save leaves `latest` naming a half-written checkpoint. Written after every rank's files, atomically.",
    deferred(lambda: ort_zero_module("zero3.saving").save_checkpoint_latest_last),
)  # fmt: skip
