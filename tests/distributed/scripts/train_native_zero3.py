"""Native DeepSpeed ZeRO-3 on CPU, no ort_zero: the baseline that proves the launchers and the stack work.

Each rank trains the same small MLP (same seed) on its own slice of a fixed global batch for a few Adam steps and
writes `<out>/rank<r>.json` with its own loss and the all-reduced global mean loss of every step, the same steps run
by plain PyTorch on the whole global batch in this process (data-parallel ZeRO-3 must reproduce them), a checksum of
the final gathered parameters, and how it was launched. Works under `deepspeed`, `torchrun` and `mpirun` alike.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist

CONFIG = {
    "train_micro_batch_size_per_gpu": 8,
    "gradient_accumulation_steps": 1,
    "gradient_clipping": 0.0,  # DeepSpeed 0.19's default is 1.0; the plain-PyTorch reference does not clip
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},  # partition every parameter
    "steps_per_print": 10**9,
}
ADAM = {"lr": 1e-2}


def global_batch(world_size: int, micro_batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed regression problem, identical on every rank; each rank trains on its own rows."""
    generator = torch.Generator().manual_seed(1234)
    inputs = torch.randn(world_size * micro_batch, 16, generator=generator)
    targets = torch.sin(inputs[:, :4] * 2.0).sum(dim=1, keepdim=True)
    return inputs, targets


def reference_losses(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor, steps: int) -> list[float]:
    """Plain PyTorch, one process, whole global batch: what ZeRO-3's averaged gradients must reproduce."""
    optimizer = torch.optim.Adam(model.parameters(), **ADAM)
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--local_rank", type=int, default=0)  # the deepspeed launcher passes it
    args = parser.parse_args()

    torch.set_num_threads(1)  # 2 ranks on a 2-core machine
    # Under mpirun DeepSpeed discovers ranks through mpi4py and would take port 29500 unless told otherwise.
    deepspeed.init_distributed(dist_backend="gloo", distributed_port=int(os.environ.get("MASTER_PORT", "29500")))
    rank, world_size = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 1)
    )
    micro = CONFIG["train_micro_batch_size_per_gpu"]
    inputs, targets = global_batch(world_size, micro)
    reference = reference_losses(copy.deepcopy(model), inputs, targets, args.steps)

    # A client torch.optim.Adam: ZeRO-3 without offload takes it as is (DeepSpeedCPUAdam would be JIT-compiled).
    optimizer = torch.optim.Adam(model.parameters(), **ADAM)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=CONFIG)
    partitioned = all(hasattr(p, "ds_id") and p.numel() == 0 for p in model.parameters())

    mine = slice(rank * micro, (rank + 1) * micro)
    local_losses, losses = [], []
    for _ in range(args.steps):
        loss = torch.nn.functional.mse_loss(engine(inputs[mine]), targets[mine])
        engine.backward(loss)
        engine.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        local_losses.append(loss.item())
        losses.append((mean / world_size).item())
    with deepspeed.zero.GatheredParameters(list(model.parameters())):
        checksum = sum(p.double().abs().sum().item() for p in model.parameters())

    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "rank": rank,
        "world_size": world_size,
        "losses": losses,
        "local_losses": local_losses,
        "reference_losses": reference,
        "param_checksum": checksum,
        "zero_stage": engine.zero_optimization_stage(),
        "partitioned": partitioned,
        "accelerator": deepspeed.get_accelerator().device_name(),
        "backend": dist.get_backend(),
        "local_rank_arg": args.local_rank,
        "launcher_env": {k: os.environ[k] for k in ("TORCHELASTIC_RUN_ID", "OMPI_COMM_WORLD_RANK") if k in os.environ},
    }
    (args.out / f"rank{rank}.json").write_text(json.dumps(result, indent=1))
    dist.barrier()
    dist.destroy_process_group()
    time.sleep(0.2)  # gloo's workers finish with the GIL free (ort_zero.distributed.shut_down_distributed says why)


if __name__ == "__main__":
    main()
