"""train_gpt under `torchrun --max-restarts 1`: in the first attempt rank 1 dies abruptly (`os._exit`, as a killed
process) at the start of step DEATH_STEP; in the restarted attempt rank 0 starts its process group START_DELAY
seconds after rank 1 (ranks of a restarted job never start together). Each attempt prints one line saying so.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from ort_zero.examples import train_gpt

DYING_RANK = 1
DEATH_STEP = 5
START_DELAY = 4.0
EXIT_CODE = 17
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

_step = train_gpt.Trainer.step
_init_distributed = train_gpt.init_distributed


def step_or_die(self: train_gpt.Trainer, step: int) -> float:
    if ATTEMPT == 0 and self.rank == DYING_RANK and step == DEATH_STEP:
        print(f"die_then_restart: rank {self.rank} exits with {EXIT_CODE} at step {step}", flush=True)
        os._exit(EXIT_CODE)
    return _step(self, step)


def init_distributed_late(*args: Any, **kwargs: Any) -> tuple[int, int]:
    if ATTEMPT > 0 and os.environ.get("RANK") == "0":
        time.sleep(START_DELAY)
    print(f"die_then_restart: attempt {ATTEMPT} rank {os.environ.get('RANK')} starts its group", flush=True)
    return _init_distributed(*args, **kwargs)


if __name__ == "__main__":
    train_gpt.Trainer.step = step_or_die
    train_gpt.init_distributed = init_distributed_late
    sys.exit(train_gpt.main())
