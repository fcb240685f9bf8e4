"""Train `LinearStack` (built under zero.Init) with ZeRO-3 that releases early, on this rank: native, through
ort_zero in PyTorch, or in ORT. Writes `<out>/rank<r>.json`: per step the RSS the forward left allocated (what is
held for the backward; run with MALLOC_MMAP_THRESHOLD_ low so that freed tensors leave RSS), and the losses."""

from __future__ import annotations

import argparse
from pathlib import Path

import deepspeed
import psutil
import torch
from rank_run import finish, start, write_result

from ort_zero.models.stack import RELEASE_EARLY_ZERO3, LinearStack


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["native", "torch", "ort"], required=True)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--local_rank", type=int, default=0)
    args = parser.parse_args()
    rank = start(args.mode)
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "zero_optimization": RELEASE_EARLY_ZERO3,
        "zero_force_ds_cpu_optimizer": False,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
    }
    torch.manual_seed(0)
    with deepspeed.zero.Init(config_dict_or_path=config):
        model = LinearStack(args.width, args.depth)
    partitioned = all(p.numel() == 0 for p in model.parameters())
    if args.mode == "ort":
        from onnxruntime.training.ortmodule import ORTModule

        model = ORTModule(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    process = psutil.Process()
    held_mib, losses = [], []
    for step in range(args.steps):
        x = torch.randn(4, 16, args.width, generator=torch.Generator().manual_seed(step * 10 + rank))
        before = process.memory_info().rss
        loss = engine(x)
        held_mib.append((process.memory_info().rss - before) / 2**20)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    result = {"held_mib": held_mib, "losses": losses, "partitioned_at_construction": partitioned}
    write_result(args.out, rank, result, engine.module if args.mode == "ort" else None)
    finish()


if __name__ == "__main__":
    main()
