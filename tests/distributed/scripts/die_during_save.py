"""train_hf with rank 1 killed while it writes its optimizer shard of checkpoint-DEATH_STEP: a node lost during a
save. The rank writes half of the file, waits GRACE seconds (the other rank gets as far as it can without it: the
worst case for what rank 0 leaves behind), prints the time and ends with `os._exit` (no cleanup, as a killed process).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from ort_zero.examples import train_hf

DYING_RANK = 1
DEATH_STEP = 4
GRACE = 5.0
EXIT_CODE = 17

_save = torch.save


def save_or_die(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
    path = Path(str(f))
    rank = int(os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
    if rank == DYING_RANK and f"checkpoint-{DEATH_STEP}" in path.parts and path.name.endswith("optim_states.pt"):
        _save(obj, path, *args, **kwargs)
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
        time.sleep(GRACE)
        print(f"die_during_save: rank {rank} exits with {EXIT_CODE} writing {path.name}", flush=True)
        os._exit(EXIT_CODE)
    _save(obj, f, *args, **kwargs)


if __name__ == "__main__":
    torch.save = save_or_die
    sys.exit(train_hf.main())
