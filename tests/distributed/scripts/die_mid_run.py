"""train_gpt with rank 1 dying abruptly at the start of step 2: what a crashed node looks like to the others.

`os._exit` skips every cleanup (no exception, no process-group shutdown), as a killed process or a lost node does.
With DIE_MID_RUN_HANG=1 the rank stops answering instead (a stuck rank: the others can only wait for the collective
timeout). Before either the rank prints the wall-clock time, so a test can measure how long the others take to notice.
"""

from __future__ import annotations

import os
import sys
import time

from ort_zero.examples import train_gpt

DYING_RANK = 1
DEATH_STEP = 2
EXIT_CODE = 17
HANG = os.environ.get("DIE_MID_RUN_HANG") == "1"

_step = train_gpt.Trainer.step


def step_or_die(self: train_gpt.Trainer, step: int) -> float:
    if self.rank == DYING_RANK and step == DEATH_STEP:
        what = "hangs" if HANG else f"exits with {EXIT_CODE}"
        print(f"die_mid_run: rank {self.rank} {what} at step {step}, time {time.time():.3f}", flush=True)
        if HANG:
            time.sleep(3600)  # the launcher stops it once another rank gives up
        os._exit(EXIT_CODE)
    return _step(self, step)


if __name__ == "__main__":
    train_gpt.Trainer.step = step_or_die
    sys.exit(train_gpt.main())
