"""`losses.csv` of the Hugging Face example (train_hf.py): every optimizer step's loss, unrounded."""

from __future__ import annotations

import csv
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from transformers import TrainerCallback

LOSS_COLUMNS = ["step", "loss", "grad_norm", "learning_rate", "time_ms"]


class StepLosses(TrainerCallback):
    """`losses.csv` on rank 0: every optimizer step's loss over its micro-batches and ranks, unrounded (the Trainer
    logs it rounded to 4 decimals), with the grad norm and learning rate the Trainer logs. A resumed run keeps the
    rows before its first step.

    The step's loss is the sum of what `training_step` returns for its micro-batches (each one's share, already
    scaled for gradient accumulation: by the step's token count, or by the number of micro-batches), averaged over
    the ranks."""

    def __init__(self, path: Path, rank: int) -> None:
        super().__init__()
        self.path, self.rank = path, rank
        self.pending = torch.zeros((), dtype=torch.float64)
        self.row: dict[str, Any] = {}
        self.began = 0.0

    def add(self, loss: torch.Tensor) -> None:
        self.pending += loss.detach().double().cpu()

    # The Trainer calls these on every rank.
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.rank != 0:
            return
        rows = []
        if state.global_step > 0 and self.path.is_file():
            with self.path.open(newline="") as handle:
                rows = [row for row in csv.DictReader(handle) if int(row["step"]) < state.global_step]
        with self.path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, LOSS_COLUMNS)
            writer.writeheader()
            writer.writerows(rows)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.began = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        dist.all_reduce(self.pending)
        loss = self.pending.item() / dist.get_world_size()
        self.pending.zero_()
        elapsed_ms = (time.perf_counter() - self.began) * 1000.0
        self.row = {"step": state.global_step - 1, "loss": repr(loss), "time_ms": f"{elapsed_ms:.3f}"}

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if self.rank != 0 or not logs or "loss" not in logs or not self.row:
            return  # evaluation and end-of-training summaries
        row = {**self.row, "grad_norm": logs.get("grad_norm", ""), "learning_rate": logs.get("learning_rate", "")}
        with self.path.open("a", newline="") as handle:
            csv.DictWriter(handle, LOSS_COLUMNS).writerow(row)
        self.row = {}
