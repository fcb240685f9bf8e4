"""`losses.csv` of the GPT example (train_gpt.py): every step's global mean loss, unrounded, and its time."""

from __future__ import annotations

import csv
from pathlib import Path

CSV_HEADER = ["step", "loss", "time_ms"]


class LossLog:
    """`losses.csv`, appended row by row; a resumed run drops the rows at or past its start step."""

    def __init__(self, path: Path, start: int) -> None:
        self.path = path
        rows = []
        if start > 0 and path.is_file():
            with path.open(newline="") as handle:
                rows = [row for row in csv.DictReader(handle) if int(row["step"]) < start]
        with path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, CSV_HEADER)
            writer.writeheader()
            writer.writerows(rows)

    def append(self, step: int, loss: float, time_ms: float) -> None:
        with self.path.open("a", newline="") as handle:
            csv.writer(handle).writerow([step, repr(loss), f"{time_ms:.3f}"])
