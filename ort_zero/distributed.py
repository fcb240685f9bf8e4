"""The process group as every ort_zero entry point starts it: gloo on CPU (DeepSpeed's CPU accelerator), the
accelerator's own backend elsewhere (nccl on CUDA), one device per local rank. Under mpirun DeepSpeed finds rank
and world size through mpi4py and takes its rendezvous port from `distributed_port`, so the launcher's MASTER_PORT
is passed on. Once ort_zero is enabled or has started the process group, the process group ends in order at
interpreter exit too (`shut_down_at_exit`), whether or not the script ends it. Under torchrun every attempt of an
elastic job leaves no addresses behind for the next one (`restarts.forget_group_addresses`)."""

from __future__ import annotations

import atexit
import functools
import os
import time
import warnings
from datetime import timedelta

import deepspeed
import torch.distributed as dist
from deepspeed.accelerator import get_accelerator

from .foreign import deepspeed as ds_internals
from .restarts import forget_group_addresses


def init_distributed(timeout: timedelta | None = None) -> tuple[int, int]:
    """Start the process group (collectives fail after `timeout`, DeepSpeed's default when None); (rank, world)."""
    accelerator = get_accelerator()
    on_cpu = accelerator.device_name() == "cpu"
    backend = "gloo" if on_cpu else accelerator.communication_backend_name()
    options = {"timeout": timeout} if timeout is not None else {}
    port = int(os.environ.get("MASTER_PORT", 29500))
    deepspeed.init_distributed(dist_backend=backend, distributed_port=port, **options)
    forget_group_addresses()  # a restarted attempt of this torchrun job must not read them
    shut_down_at_exit()
    quiet_deprecated_collectives()  # from the first gather on (zero.Init's, before ort_zero may be enabled)
    if not on_cpu:
        accelerator.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    remove_shared_memory_files()
    return dist.get_rank(), dist.get_world_size()


def remove_shared_memory_files() -> None:
    """Removes this rank's file of DeepSpeed's CPU allreduce from /dev/shm, which DeepSpeed leaves behind (66 MiB
    of memory per rank per run). Once every rank has started its process group (a barrier), every rank has mapped
    every file; the mappings outlive the names."""
    if not dist.is_initialized():
        return
    dist.barrier()
    ds_internals.cpu_allreduce_buffer(dist.get_rank()).unlink(missing_ok=True)


# torch 2.14 deprecates the collectives DeepSpeed 0.19.8's ZeRO-3 runs on every gather and gradient reduce-scatter
# (FutureWarning). Python says a warning once per place but forgets it whenever the warning filters change (every
# `catch_warnings` block; its "once" too): a 4-step ORT run at sequence 1024 said it ~200 times, natively ~1,100. It is
# DeepSpeed's to act on, not the user's: under ort_zero `ort-zero doctor` says it, the run does not.
DEPRECATED_COLLECTIVES = r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated"


def quiet_deprecated_collectives() -> None:
    """torch's deprecation of the collectives DeepSpeed calls is not said by the run (the doctor says it)."""
    warnings.filterwarnings("ignore", message=DEPRECATED_COLLECTIVES, category=FutureWarning)


# How long the GIL is left free after the process group is destroyed: gloo's worker threads need microseconds.
GLOO_DRAIN_SECONDS = 0.2


def shut_down_distributed() -> None:
    """End a job's process group: all ranks reach the end, the groups are destroyed, gloo's workers finish.

    A gloo worker thread finishes a collective after the caller has returned from it; when that collective is a
    barrier it then frees earlier collectives' tensors, which takes the GIL. A rank whose interpreter is already
    finalizing refuses it and aborts with "terminate called without an active exception" (one run in ~60 on torch
    2.14, natively too; pytorch#179291). Sleeping with the GIL released lets those threads finish first.
    """
    if not dist.is_initialized():
        return
    remove_shared_memory_files()  # a process group ort_zero did not start (the Trainer's) leaves its files too
    _destroy_and_drain()


@functools.cache  # registered once
def shut_down_at_exit() -> None:
    """Make the process group end in order when the interpreter exits, also in a script that never calls
    `shut_down_distributed()` (the abort it prevents: its docstring).

    Python runs exit handlers last-registered first, all of them before it tears down modules and threads: this
    one, registered when ort_zero is enabled or starts the process group (after torch's and DeepSpeed's imports
    registered theirs), runs before them. It runs no collective: a rank that exits on an error must not wait for
    ranks still training (they notice the closed connections, as without it). A script that ended the group
    itself leaves it nothing to do."""
    atexit.register(_shut_down_without_collectives)


def _shut_down_without_collectives() -> None:
    if not dist.is_initialized():
        return
    # DeepSpeed maps every rank's file while the group starts: a rank exiting before the others started has failed
    ds_internals.cpu_allreduce_buffer(dist.get_rank()).unlink(missing_ok=True)
    _destroy_and_drain()


def _destroy_and_drain() -> None:
    dist.destroy_process_group()
    time.sleep(GLOO_DRAIN_SECONDS)  # with the GIL free: gloo's workers finish before the interpreter finalizes
