"""The process group as every ort_zero entry point starts it: gloo on CPU (DeepSpeed's CPU accelerator), the
accelerator's own backend elsewhere (nccl on CUDA), one device per local rank. Under mpirun DeepSpeed finds rank
and world size through mpi4py and takes its rendezvous port from `distributed_port`, so the launcher's MASTER_PORT
is passed on."""

from __future__ import annotations

import os
import time
from datetime import timedelta

import deepspeed
import torch.distributed as dist
from deepspeed.accelerator import get_accelerator

from .foreign import deepspeed as ds_internals


def init_distributed(timeout: timedelta | None = None) -> tuple[int, int]:
    """Start the process group (collectives fail after `timeout`, DeepSpeed's default when None); (rank, world)."""
    accelerator = get_accelerator()
    on_cpu = accelerator.device_name() == "cpu"
    backend = "gloo" if on_cpu else accelerator.communication_backend_name()
    options = {"timeout": timeout} if timeout is not None else {}
    port = int(os.environ.get("MASTER_PORT", 29500))
    deepspeed.init_distributed(dist_backend=backend, distributed_port=port, **options)
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
    dist.destroy_process_group()
    time.sleep(GLOO_DRAIN_SECONDS)
