"""Train the toy model with PyTorch DDP on this rank, in ORT (optionally with memory-efficient gradients) or not.

Writes `<out>/rank<r>.json` with per-step losses, the final parameters and, for ORT, what the ORT graph ran.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from zero3_models import MODELS, batch

import ort_zero  # before ORTModule (imported in main): it makes ORTModule importable on torch >= 2.9
from ort_zero.distributed import shut_down_distributed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["torch", "ort"], required=True)
    parser.add_argument("--mem-grads", action="store_true")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = MODELS["zoo"]()
    if args.mode == "ort":
        from onnxruntime.training.ortmodule import ORTModule

        ort_zero.enable_mem_efficient_grads(args.mem_grads)
        model = ORTModule(model)
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.Adam([p for p in ddp.parameters() if p.requires_grad], lr=3e-3, eps=1e-6)
    losses = []
    for step in range(args.steps):
        loss = ddp(**batch(step, rank))["loss"]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    result: dict = {"losses": losses}
    if rank == 0:
        result["params"] = {n: p.detach().double().flatten().tolist() for n, p in model.named_parameters()}
    if args.mode == "ort":
        from ort_zero.ort.inspection import ort_run_record

        result["ort"] = ort_run_record(model)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{rank}.json").write_text(json.dumps(result))
    shut_down_distributed()


if __name__ == "__main__":
    os.environ.setdefault("ORTMODULE_FALLBACK_POLICY", "FALLBACK_DISABLE")
    main()
