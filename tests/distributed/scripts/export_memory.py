"""One rank of the export-memory test: a model whose parameters dominate, built partitioned under zero.Init and
exported by ORTModule in its first step; records how far RSS rose while ORT exported it (VmHWM reset before) and
the loss, which must be the model's (the stand-ins of the export are not its weights).

A small plain ORTModule trains first: a process's first export also pays what any first export pays (lazy imports,
ORT's extensions, torch's thread pools): a first export rose by 16-19 MiB here and once by 36 in CI, the
model's export after a warm-up by 6-14."""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

import deepspeed
import torch
from rank_run import finish, start, write_result
from torch import nn

VOCAB, WIDTH, HIDDEN, BLOCKS = 32000, 512, 2048, 36  # embedding 62.5 MiB, each Linear 4 MiB: 350.5 MiB in all


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(WIDTH, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, WIDTH)) for _ in range(BLOCKS)
        )

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = x + block(x)
        return x.square().mean()


def status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise KeyError(field)


def measuring_export(export_model: staticmethod, record: dict[str, float]) -> staticmethod:
    """ORTModule's export, with the rise of RSS above where it started recorded (peak: VmHWM, reset first)."""

    @functools.wraps(export_model.__func__)
    def export(*args: object, **kwargs: object) -> object:
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        before = status_kib("VmRSS")
        exported = export_model(*args, **kwargs)
        record["export_rise_mib"] = (status_kib("VmHWM") - before) / 1024  # the last export's
        return exported

    return staticmethod(export)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--local_rank", type=int, default=0)
    args = parser.parse_args()
    rank = start("ort")
    from onnxruntime.training.ortmodule import ORTModule
    from onnxruntime.training.ortmodule._graph_transition_manager import GraphTransitionManager

    record: dict[str, float] = {}
    GraphTransitionManager._export_model = measuring_export(GraphTransitionManager.__dict__["_export_model"], record)
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}, "optimizer": {
        "type": "SGD", "params": {"lr": 1e-3}}, "zero_allow_untested_optimizer": True}  # fmt: skip
    with deepspeed.zero.Init(config_dict_or_path=config):
        model = Model()
    params = list(model.parameters())
    record["params_mib"] = sum(p.ds_numel * p.element_size() for p in params) / 2**20
    record["largest_mib"] = max(p.ds_numel * p.element_size() for p in params) / 2**20
    warm_up = ORTModule(nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 1)))
    warm_up(torch.ones(2, 8)).sum().backward()
    engine, *_ = deepspeed.initialize(model=ORTModule(model), config=config)
    loss = engine(torch.randint(0, VOCAB, (1, 16), generator=torch.Generator().manual_seed(rank)))
    record["loss"] = loss.item()
    engine.backward(loss)
    engine.step()
    write_result(args.out, rank, record, engine)
    finish()


if __name__ == "__main__":
    main()
