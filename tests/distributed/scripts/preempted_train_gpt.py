"""train_gpt preempted: rank 0 sends SIGTERM to its launcher (torchrun, which passes it to every rank) during step
PREEMPT_STEP, which then takes HOLD seconds more (the signal reaches the ranks inside the step). Each rank writes
`exit-rank<r>.json` (its exit code and wall-clock time) at its end, rank 0 `signalled.json` into --output-dir.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from ort_zero.examples import train_gpt

PREEMPT_STEP = int(os.environ.get("PREEMPT_STEP", "2"))
HOLD = 2.0

_step = train_gpt.Trainer.step


def preempted_step(self: train_gpt.Trainer, step: int) -> float:
    if step == PREEMPT_STEP and self.rank == 0:
        (self.args.output_dir / "signalled.json").write_text(json.dumps({"time": time.time(), "step": step}))
        os.kill(os.getppid(), signal.SIGTERM)
    loss = _step(self, step)
    if step == PREEMPT_STEP:
        time.sleep(HOLD)
    return loss


def main() -> int:
    code = train_gpt.main()
    folder = Path(sys.argv[sys.argv.index("--output-dir") + 1])
    (folder / f"exit-rank{os.environ['RANK']}.json").write_text(json.dumps({"code": code, "time": time.time()}))
    return code


if __name__ == "__main__":
    train_gpt.Trainer.step = preempted_step
    sys.exit(main())
