"""train_hf with transformers' `enable_jit_checkpoint=True`, preempted by real SIGTERMs at a chosen step.

PREEMPT=backward: rank 0 sends SIGTERM to its launcher (torchrun, which passes it to every rank) at the start of the
backward of step PREEMPT_STEP, and that backward then takes HOLD seconds more (a long backward: transformers' 3 s
timer ends inside it). PREEMPT=late_rank: rank 0 sends SIGTERM to itself at that backward and to rank 1 LATE seconds
later (a scheduler that reaches the ranks one by one); every step from then on takes SLOW_STEP seconds more, so the
run is still training when the later signal comes.

Each rank writes `pid-rank<r>` at its start and `exit-rank<r>.json` (its exit code and wall-clock time) at its end;
rank 0 writes `signalled.json` (when the first SIGTERM was sent) into --output-dir.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from deepspeed.runtime.engine import DeepSpeedEngine

from ort_zero.examples import train_hf

SCENARIO = os.environ["PREEMPT"]
PREEMPT_STEP = int(os.environ.get("PREEMPT_STEP", "3"))
HOLD, LATE, SLOW_STEP = 4.0, 2.0, 0.5

_backward = DeepSpeedEngine.backward
_training_arguments = train_hf.training_arguments


def rank() -> int:
    return int(os.environ["RANK"])


def output_dir() -> Path:
    return Path(sys.argv[sys.argv.index("--output-dir") + 1])


def signal_late(pid_file: Path) -> None:
    try:
        os.kill(int(pid_file.read_text()), signal.SIGTERM)
    except ProcessLookupError:
        pass  # it has already saved and exited


def preempting_backward(engine: DeepSpeedEngine, *args: Any, **kwargs: Any) -> Any:
    step = engine.global_steps  # the optimizer steps done: this backward belongs to step `step`
    at_preemption = step == PREEMPT_STEP and engine.is_gradient_accumulation_boundary()
    if at_preemption and rank() == 0:
        (output_dir() / "signalled.json").write_text(json.dumps({"time": time.time(), "step": step}))
        if SCENARIO == "backward":
            os.kill(os.getppid(), signal.SIGTERM)
        else:
            os.kill(os.getpid(), signal.SIGTERM)
            threading.Timer(LATE, signal_late, (output_dir() / "pid-rank1",)).start()
    result = _backward(engine, *args, **kwargs)
    if at_preemption and SCENARIO == "backward":
        time.sleep(HOLD)
    if step >= PREEMPT_STEP and SCENARIO == "late_rank":
        time.sleep(SLOW_STEP)
    return result


def with_jit_checkpoint(args: Any, **overrides: Any) -> Any:
    return _training_arguments(args, **{**overrides, "enable_jit_checkpoint": True})


def main() -> int:
    folder = output_dir()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"pid-rank{rank()}").write_text(str(os.getpid()))
    code = train_hf.main()
    (folder / f"exit-rank{rank()}.json").write_text(json.dumps({"code": code, "time": time.time()}))
    return code


if __name__ == "__main__":
    DeepSpeedEngine.backward = preempting_backward
    train_hf.training_arguments = with_jit_checkpoint
    sys.exit(main())
