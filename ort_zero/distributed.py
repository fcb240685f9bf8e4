"""The process group as every ort_zero entry point starts it: gloo on CPU (DeepSpeed's CPU accelerator), the
accelerator's own backend elsewhere (nccl on CUDA), one device per local rank. Under mpirun DeepSpeed finds rank
and world size through mpi4py and takes its rendezvous port from `distributed_port`, so the launcher's MASTER_PORT
is passed on."""

from __future__ import annotations

import os
from datetime import timedelta

import deepspeed
import torch.distributed as dist
from deepspeed.accelerator import get_accelerator


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
    return dist.get_rank(), dist.get_world_size()
