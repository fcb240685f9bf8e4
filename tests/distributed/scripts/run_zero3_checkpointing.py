"""A layer stack trained with activation checkpointing under DeepSpeed ZeRO-3 on this rank: natively, through
ort_zero's hooks in PyTorch, or in ORT.

Each checkpoint kind trains a fresh engine: torch.utils.checkpoint reentrant and non-reentrant, and
deepspeed.checkpointing.checkpoint, called through the module attributes as model code usually does (under ORT they
are ORT's own wrappers then). In PyTorch the layers note each recompute (a forward run inside the backward) and
whether their parameters were gathered for it; under ORT their Python forward runs only while exporting. Writes
`<out>/rank<r>.json`: {kind: {losses, released_after_forward, recomputes, params (rank 0), ort (--mode ort: ORT's
run record)}}.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import deepspeed
import torch
import torch.utils.checkpoint
from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
from rank_run import finish, start, write_result
from torch import nn

VOCAB, WIDTH, LAYERS, STEPS = 32, 16, 3, 6
CONFIG = {
    "train_micro_batch_size_per_gpu": 4,
    # every parameter partitioned, no prefetch, no reuse window: a layer's parameters are released after its forward
    "zero_optimization": {
        "stage": 3,
        "stage3_param_persistence_threshold": 0,
        "stage3_prefetch_bucket_size": 0,
        "stage3_max_reuse_distance": 0,
    },
    "zero_force_ds_cpu_optimizer": False,
    "steps_per_print": 10**9,
}
CHECKPOINTS: dict[str, Callable[..., torch.Tensor]] = {
    "torch_reentrant": lambda f, x: torch.utils.checkpoint.checkpoint(f, x, use_reentrant=True),
    "torch_non_reentrant": lambda f, x: torch.utils.checkpoint.checkpoint(f, x, use_reentrant=False),
    "deepspeed": lambda f, x: deepspeed.checkpointing.checkpoint(f, x),
}


class Noted:
    """A layer that notes, whenever it runs inside a backward (a recompute), whether its parameters are gathered."""

    recomputes: list[dict[str, Any]]
    name = ""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch._C._current_graph_task_id() != -1:  # autograd is running a backward
            gathered = all(p.ds_status == ZeroParamStatus.AVAILABLE for p in self.parameters(recurse=False))
            self.recomputes.append({"layer": self.name, "gathered": gathered})
        return super().forward(x)  # type: ignore[misc]


class Linear(Noted, nn.Linear):
    pass


class LayerNorm(Noted, nn.LayerNorm):
    pass


class Block(nn.Module):
    """A residual MLP: one transformer-like layer."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = LayerNorm(WIDTH)
        self.up = Linear(WIDTH, 2 * WIDTH)
        self.down = Linear(2 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Checkpointed(nn.Module):
    """Embedding, a ModuleList of blocks each run through `checkpoint`, a head; returns the loss."""

    def __init__(self, checkpoint: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.recomputes: list[dict[str, Any]] = []
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.head = nn.Linear(WIDTH, VOCAB)
        self.checkpoint = checkpoint
        for name, module in self.named_modules():
            if isinstance(module, Noted):
                module.name, module.recomputes = name, self.recomputes

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for layer in self.layers:
            h = self.checkpoint(layer, h)
        return nn.functional.cross_entropy(self.head(h).flatten(0, 1), labels.flatten())


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Learnable (each token follows from the last by a fixed rule), different per step and rank."""
    generator = torch.Generator().manual_seed(100 * step + rank)
    tokens = [torch.randint(0, VOCAB, (CONFIG["train_micro_batch_size_per_gpu"],), generator=generator)]
    for _ in range(8):
        tokens.append((tokens[-1] * 5 + 3) % VOCAB)
    ids = torch.stack(tokens, dim=1)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def train(kind: str, mode: str, rank: int) -> dict[str, Any]:
    torch.manual_seed(0)
    model = Checkpointed(CHECKPOINTS[kind])
    wrapped: nn.Module = model
    if mode == "ort":
        from onnxruntime.training.ortmodule import ORTModule

        wrapped = ORTModule(model)
    optimizer = torch.optim.Adam(wrapped.parameters(), lr=1e-2, eps=1e-6)
    engine, *_ = deepspeed.initialize(model=wrapped, optimizer=optimizer, config=CONFIG)
    losses, released = [], []
    for step in range(STEPS):
        loss = engine(*batch(step, rank))
        released.append(all(p.ds_status == ZeroParamStatus.NOT_AVAILABLE for p in model.layers.parameters()))
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    result: dict[str, Any] = {
        "losses": losses,
        "released_after_forward": released,
        "recomputes": model.recomputes,
        "ort_zero_hooks": hasattr(engine.optimizer.parameter_offload, "ort_zero_subscriber"),
    }
    if mode == "ort":
        from ort_zero.ort.inspection import ort_run_record

        result["ort"] = ort_run_record(engine.module)["training"]
    named = list(model.named_parameters())
    with deepspeed.zero.GatheredParameters([p for _, p in named]):
        if rank == 0:
            result["params"] = {name: p.detach().double().flatten().tolist() for name, p in named}
    engine.destroy()
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["native", "torch", "ort"], required=True)
    parser.add_argument("--kind", choices=sorted(CHECKPOINTS), action="append", required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rank = start(args.mode)
    results = {kind: train(kind, args.mode, rank) for kind in args.kind}
    write_result(args.out, rank, results)
    finish()


if __name__ == "__main__":
    os.environ.setdefault("ORTMODULE_FALLBACK_POLICY", "FALLBACK_DISABLE")
    main()
