"""An example (train_gpt; train_hf with DIE_THEN_RESTART_EXAMPLE=train_hf) under `torchrun --max-restarts 1`: in
the first attempt rank 1 dies abruptly (`os._exit`, as a killed process) at the start of step DEATH_STEP; in the
restarted attempt rank 0 starts its process group START_DELAY seconds after rank 1 (the ranks of a restarted job
never start together). With DIE_THEN_RESTART_NEVER_START=1 the restarted rank 0 never starts its group (a rank that
cannot come back): rank 1 can only wait. Each rank says which attempt it is in when it starts its group.
DIE_THEN_RESTART_GROUP says who starts the group: ort_zero's `init_distributed` (default), `deepspeed` (DeepSpeed's
`init_distributed()`), `torch` (`init_process_group` with `env://`) or `accelerate` (its `PartialState`).
With DIE_THEN_RESTART_ONCE=<file>, rank 1 dies at DEATH_STEP if that file does not exist yet (and creates it), in
whichever attempt: agents of several nodes count their restarts each on their own. train_gpt's ranks say at which
step they resume.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist

from ort_zero.examples import rank_run, train_gpt, train_hf

DYING_RANK = 1
DEATH_STEP = 5
START_DELAY = 4.0
EXIT_CODE = 17
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
NEVER_START = os.environ.get("DIE_THEN_RESTART_NEVER_START") == "1"
EXAMPLE = os.environ.get("DIE_THEN_RESTART_EXAMPLE", "train_gpt")
GROUP = os.environ.get("DIE_THEN_RESTART_GROUP", "ort_zero")
ONCE = os.environ.get("DIE_THEN_RESTART_ONCE")

_step = train_gpt.Trainer.step
_resume = train_gpt.Trainer.resume
_step_begin = train_hf.StepLosses.on_step_begin
_init_distributed = rank_run.init_distributed


def dies_now() -> bool:
    if ONCE is None:
        return ATTEMPT == 0
    if Path(ONCE).exists():
        return False
    Path(ONCE).touch()
    return True


def die_at(step: int) -> None:
    if os.environ["RANK"] == str(DYING_RANK) and step == DEATH_STEP and dies_now():
        print(f"die_then_restart: rank {DYING_RANK} exits with {EXIT_CODE} at step {step}", flush=True)
        os._exit(EXIT_CODE)


def step_or_die(self: train_gpt.Trainer, step: int) -> float:
    die_at(step)
    return _step(self, step)


def resume_and_say(self: train_gpt.Trainer) -> int:
    start = _resume(self)
    print(f"die_then_restart: attempt {ATTEMPT} rank {self.rank} resumes at step {start}", flush=True)
    return start


def step_begin_or_die(self: train_hf.StepLosses, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
    die_at(state.global_step)
    _step_begin(self, args, state, control, **kwargs)


def init_distributed_late(*args: Any, **kwargs: Any) -> tuple[int, int]:
    rank = os.environ["RANK"]
    if ATTEMPT > 0 and rank == "0":
        time.sleep(3600 if NEVER_START else START_DELAY)  # the launcher stops a rank that never starts
    print(f"die_then_restart: attempt {ATTEMPT} rank {rank} starts its group", flush=True)
    return _init_distributed(*args, **kwargs) if GROUP == "ort_zero" else start_group_without_ort_zero(*args)


def start_group_without_ort_zero(timeout: timedelta) -> tuple[int, int]:
    """The group as a script that does not call ort_zero for it starts it."""
    if GROUP == "deepspeed":
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo", timeout=timeout)
    elif GROUP == "torch":
        dist.init_process_group("gloo", init_method="env://", timeout=timeout)
    elif GROUP == "accelerate":
        from accelerate import PartialState

        PartialState(cpu=True, backend="gloo", timeout=timeout)
    else:
        raise ValueError(f"DIE_THEN_RESTART_GROUP={GROUP!r}: ort_zero, deepspeed, torch or accelerate")
    return dist.get_rank(), dist.get_world_size()


if __name__ == "__main__":
    train_gpt.Trainer.step = step_or_die
    train_gpt.Trainer.resume = resume_and_say
    train_hf.StepLosses.on_step_begin = step_begin_or_die
    rank_run.init_distributed = init_distributed_late
    sys.exit(train_hf.main() if EXAMPLE == "train_hf" else train_gpt.main())
