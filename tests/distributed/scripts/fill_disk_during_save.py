"""train_hf in which another process fills the disk while rank 1 writes its optimizer shard of checkpoint-FULL_STEP:
just before the write, `dd` (a process of its own, as any other program on the machine) writes zeros to the file
FILL_DISK_FILLER until the disk is full; then rank 1's torch.save runs out of room."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from ort_zero.examples import train_hf

FILLING_RANK = 1
FULL_STEP = 4

_save = torch.save


def save_after_the_disk_fills(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
    path = Path(str(f))
    rank = int(os.environ.get("RANK", "0"))
    if rank == FILLING_RANK and f"checkpoint-{FULL_STEP}" in path.parts and path.name.endswith("optim_states.pt"):
        filler = os.environ["FILL_DISK_FILLER"]
        subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True, check=False)
        print(f"fill_disk_during_save: the disk is full before rank {rank} writes {path.name}", flush=True)
    _save(obj, f, *args, **kwargs)


if __name__ == "__main__":
    torch.save = save_after_the_disk_fills
    sys.exit(train_hf.main())
