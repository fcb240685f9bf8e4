"""DeepSpeed's internals that ort_zero reads and writes (deepspeed `versions.DEEPSPEED_VERSIONS`).

Read: the parameter coordinator's private `__inflight_param_registry` (prefetches in flight), `_invalidate_trace`, its
prefetch bucket and live-parameter counts and `__all_gather_params` (the gathers its prefetch starts), which
parameters it fetches for a module (`fetched_params`: what its `fetch_sub_module` iterates),
a module's `_external_params`, the accelerator's `_name`, the F.linear zero.Init set aside (`linear_bk`), the ZeRO-3
optimizer behind a parameter's gradient hook (a closure DeepSpeed registers) and its private
`__reduce_and_partition_ipg_grads` (reduce the gradients held in the bucket now), and the name of the shared-memory
file of its CPU allreduce (`ops/csrc/cpu/comm/shm.cpp`). Written: the fields of `DeepSpeedZeRoOffload` that its own
`setup_zero_stage3_hooks` sets (ort_zero replaces that method) and the module-level `FWD_MODULE_STACK` that
DeepSpeed's forward hooks push and pop.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from . import torch as torch_internals


def torch_linear_behind_zero3_wrap(current: Any) -> Any:
    """torch's own F.linear where zero.Init left DeepSpeed's wrapper in its place (kept as `linear_bk`)."""
    from deepspeed.runtime.zero.linear import zero3_linear_wrap
    from deepspeed.runtime.zero.partition_parameters import InsertPostInitMethodToModuleSubClasses

    if current is not zero3_linear_wrap:
        return current
    return getattr(InsertPostInitMethodToModuleSubClasses, "linear_bk", current)


def fetched_params(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters DeepSpeed fetches for `module`: its own, its external ones, and all below a z3 leaf module."""
    from deepspeed.runtime.zero.partitioned_param_coordinator import iter_params
    from deepspeed.utils import z3_leaf_module

    unique: dict[int, torch.nn.Parameter] = {}
    for param in iter_params(module, recurse=z3_leaf_module(module)):
        unique.setdefault(id(param), param)
    return sorted(unique.values(), key=lambda p: p.ds_id)


def forward_module_stack() -> list[torch.nn.Module]:
    """The modules whose forward is running, innermost last, as DeepSpeed's hooks keep them."""
    from deepspeed.runtime.zero import parameter_offload

    return parameter_offload.FWD_MODULE_STACK


def has_external_param(module: torch.nn.Module, param: torch.nn.Parameter) -> bool:
    """Whether `param` is registered as an external parameter of `module` (`register_external_parameter`)."""
    return id(param) in getattr(module, "_external_params", {})


def wait_for_inflight_gathers(offload: Any, params: list[torch.nn.Parameter]) -> None:
    """Finishes the coordinator's prefetch of any of `params` still in flight."""
    registry = offload.get_param_coordinator()._PartitionedParameterCoordinator__inflight_param_registry
    for param in params:
        if param in registry:
            registry.pop(param).wait()


def records_trace(offload: Any) -> bool:
    """Whether the coordinator is recording this step's module order (its first step): it prefetches nothing."""
    return offload.get_param_coordinator().is_record_trace()


def prefetch_budget(offload: Any) -> int:
    """How many elements the coordinator's prefetch would gather at once now: its bucket
    (`stage3_prefetch_bucket_size`), within what its live-parameter limit (`stage3_max_live_parameters`) leaves."""
    coordinator = offload.get_param_coordinator()
    private = vars(coordinator)
    prefix = "_PartitionedParameterCoordinator__"
    live_room = private[prefix + "max_n_available_params"] - private[prefix + "n_available_params"]
    return max(0, min(live_room, private[prefix + "prefetch_bucket_sz"]))


def start_gathers(offload: Any, params: list[torch.nn.Parameter], forward: bool) -> None:
    """Starts gathering `params` as the coordinator's own prefetch does: the handles go to its registry of gathers in
    flight, which its fetch of their module waits on."""
    offload.get_param_coordinator()._PartitionedParameterCoordinator__all_gather_params(set(params), forward)


def invalidate_trace(offload: Any) -> None:
    """The coordinator forgets the module order it recorded (hooks changed: it is stale)."""
    coordinator = offload.get_param_coordinator()
    if not coordinator.is_invalid_trace():
        coordinator._invalidate_trace()


def take_over_hooks(offload: Any, handle: Any, subscriber: Any) -> None:
    """What `setup_zero_stage3_hooks` leaves on `offload`, with ort_zero's `handle` for DeepSpeed's hook handles
    (`destroy()` removes them through it) and its `subscriber` kept beside them."""
    offload.hierarchy = 0
    offload.ort_zero_subscriber = subscriber
    offload.fwd_pre_hook = handle
    offload.forward_hooks = [handle]
    offload.backward_hooks = []


def accelerator_name() -> str:
    """The accelerator DeepSpeed picked (cpu, cuda, ...)."""
    from deepspeed.accelerator import get_accelerator

    return get_accelerator()._name


def stage3_optimizer_behind(param: torch.nn.Parameter) -> Any | None:
    """The ZeRO-3 optimizer whose gradient hook `param` carries, or None.

    DeepSpeed registers its post-accumulate hook as a closure over the optimizer (`self`), wrapped by
    `instrument_w_nvtx`; nothing else links a parameter, or the offload ort_zero hooks, to its optimizer.
    """
    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3

    pending = list(torch_internals.post_accumulate_grad_hooks(param))
    for _ in range(3):  # the hook, the function it wraps, the closure that function was made in
        found = [cell.cell_contents for fn in pending for cell in getattr(fn, "__closure__", None) or ()]
        for value in found:
            if isinstance(value, DeepSpeedZeroOptimizer_Stage3):
                return value
        pending = [value for value in found if callable(value)]
    return None


def reduce_bucketed_gradients(optimizer: Any, param: torch.nn.Parameter) -> None:
    """The optimizer reduce-scatters the gradients waiting in `param`'s bucket now, as it would when the next one
    arrives, and lets go of them."""
    optimizer._DeepSpeedZeroOptimizer_Stage3__reduce_and_partition_ipg_grads(optimizer.get_param_comm_dtype(param))


def cpu_allreduce_buffer(rank: int) -> Path:
    """The shared-memory file DeepSpeed's CPU allreduce creates for `rank` when every rank is on one machine.

    DeepSpeed maps every rank's file while its process group starts and never unlinks them: each run leaves 66 MiB
    of /dev/shm (memory) per rank behind, until the machine restarts."""
    address, port = os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", "")
    return Path("/dev/shm") / f"deepspeed_allreduce_buffer_{os.getuid()}_{address}_{port}_{rank}"
